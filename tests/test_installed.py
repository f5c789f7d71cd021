"""The harness as its users have it: built, installed into a fresh environment, run from elsewhere.

One test walks the whole way, in order, because each step needs the environment the one before
made (a virtual environment costs half a minute to fill):

1. the sdist builds (PEP 517, this checkout), the wheel is built *from the sdist*, and the wheel
   carries every file a run reads (`harness.data`), byte for byte the checkout's ``cases/`` files;
2. a fresh virtual environment (no system site-packages) gets this machine's torch and the
   harness's requirements, pinned to the versions here; ``pytest --version`` is timed there, and
   pytest's ``--help`` and ``--markers`` are kept;
3. the wheel goes in (``pip check`` says its metadata and requirements hold), and with it installed
   but not opted in: ``pytest --version`` timed again, ``--help`` and ``--markers`` unchanged, and a
   project's own test run imports no torch and has no harness plugin; opted in (``-p ckpt_harness``),
   the options are there (the control that the comparison can fail);
4. from a folder outside the repository, ``run --impl bundled,torch`` exits 0 with the same
   outcome and verdict for every case as the checkout gives, and records the harness version;
5. a third party's package (tests/fixtures/thirdparty_adapter: an adapter registered by entry
   point and an expectations file of its own bug) is installed: its impl is listed with its
   package, runs by name in the CLI and under pytest with its own entries judging its cells
   (xfail, exit 0), and its package's version is recorded; run by import path instead (its
   entries name the registered name, so none applies) the same cells fail: the entries are what
   made them xfail.

Nothing here measures speed: the ``pytest --version`` figures are printed (``-s``) and attached
to the test (``record_property``), never compared with a limit.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from harness import __version__
from harness import data as shipped_data

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_PACKAGE = ROOT / "tests" / "fixtures" / "thirdparty_adapter"
STEP_LIMIT_S = 900  # one pip install or one run, however loaded the machine: a hang guard, not a speed test
# What the harness needs at run time and under pytest, pinned to the versions of this environment
# so that the installed run and the checkout's run compare like with like.
RUNTIME = ("torch", "numpy", "pandas", "tabulate", "packaging", "hypothesis", "pytest", "pytest-xdist")
THIRD_PARTY_IMPL = "thirdparty-nopreserve"


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point a child at the checkout or at this
    pytest session (PYTHONPATH, PYTEST_*, HARNESS_*)."""
    return {k: v for k, v in os.environ.items()
            if k != "PYTHONPATH" and not k.startswith(("PYTEST_", "HARNESS_"))}


def _run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=STEP_LIMIT_S)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _build_from_sdist(source: Path, out: Path) -> Path:
    """The wheel built from `source`'s sdist (both PEP 517, with this environment's setuptools)."""
    sdist_dir, wheel_dir = out / "sdist", out / "wheel"
    sdist_dir.mkdir(parents=True)
    backend = "from setuptools import build_meta; import sys; print(build_meta.build_sdist(sys.argv[1]))"
    name = _run([sys.executable, "-c", backend, str(sdist_dir)], cwd=source).stdout.strip().splitlines()[-1]
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir),
          str(sdist_dir / name)], cwd=out)
    [wheel] = wheel_dir.glob("*.whl")
    return wheel


# What pip says where no package index can be reached (a GPU machine that downloads nothing), or
# the index lacks this environment's exact versions (a CUDA torch of the machine's own image).
UNREACHABLE = ("Could not find a version that satisfies", "No matching distribution found",
               "Failed to establish a new connection", "Temporary failure in name resolution")


def _make_venv(where: Path) -> Path:
    """A fresh virtual environment with this environment's torch and the harness's requirements;
    the test is skipped, saying why, where pip cannot get them (no index reachable here)."""
    _run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    python = where / "bin" / "python"
    pins = [f"{name}=={metadata.version(name)}" for name in RUNTIME]
    proc = _run([str(python), "-m", "pip", "install", "-q", "--retries", "1", *pins], cwd=where.parent, check=False)
    if proc.returncode != 0:
        said = [line for line in proc.stderr.splitlines() if any(text in line for text in UNREACHABLE)]
        if said:
            pytest.skip(f"cannot fill a fresh environment with {', '.join(pins)} here: {said[0].strip()}")
        raise AssertionError(f"pip install {' '.join(pins)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return python


def _pytest_version_s(python: Path, cwd: Path, times: int = 7) -> float:
    """The median wall time of ``pytest --version`` (a figure to report, not to judge)."""
    taken = []
    for _ in range(times):
        start = time.perf_counter()
        _run([str(python), "-m", "pytest", "--version"], cwd=cwd)
        taken.append(time.perf_counter() - start)
    return statistics.median(taken)


def _verdicts(report_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(impl, case id) -> (outcome, verdict) of every record in a report."""
    out = {}
    for line in (report_dir / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[(record["impl"], record["case_id"])] = (record["outcome"], record["verdict"])
    return out


def _records(report_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]


def readme_commands() -> list[list[str]]:
    """The commands of the README's "Use it from your project" block after its ``pip install``,
    as arguments to a Python interpreter (``pytest ...`` becomes ``-m pytest ...``), with the
    fixture's impl for YOUR_IMPL."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it from your project", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line.replace("YOUR_IMPL", THIRD_PARTY_IMPL))
        if words[:2] == ["pip", "install"]:
            continue  # the wheel under test is installed instead
        assert words[0] in ("python", "pytest"), f"the README shows a command this test cannot run: {line}"
        commands.append(words[1:] if words[0] == "python" else ["-m", *words])
    assert len(commands) >= 4
    return commands


PROJECT_TEST = '''
import sys


def test_a_project_test_runs_as_before(pytestconfig):
    assert "torch" not in sys.modules, "the installed harness imported torch into a project that did not opt in"
    assert not pytestconfig.pluginmanager.has_plugin("harness.fronts.plugin")
    assert pytestconfig.pluginmanager.has_plugin("ckpt_harness"), "the entry point was not loaded at all"
'''


@pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="needs the source checkout it builds")
def test_the_installed_package_runs_like_the_checkout(tmp_path, record_property):
    # 1. sdist -> wheel, and the data a run reads is in it, the same bytes as the checkout's cases/
    wheel = _build_from_sdist(ROOT, tmp_path / "dist")
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for name in ("expectations.toml", "corpus.toml", "machines/h200-torch2.11.json",
                     "machines/cpu-torch2.13.json"):
            assert archive.read(f"harness/data/{name}") == (ROOT / "cases" / name).read_bytes(), name
        assert "harness/fronts/repro_template.py" in names and "harness/pytest_cases.py" in names
        entry_points = archive.read(f"ckpt_rng_harness-{__version__}.dist-info/entry_points.txt").decode()
    assert "[pytest11]\nckpt_harness = harness.fronts.pytest_entry" in entry_points
    record_property("wheel_bytes", wheel.stat().st_size)
    record_property("wheel_files", len(names))

    # 2. a fresh environment, and pytest as it is there before the harness
    project = tmp_path / "project"  # a folder of someone else's, outside the repository
    project.mkdir()
    (project / "test_theirs.py").write_text(PROJECT_TEST)
    python = _make_venv(tmp_path / "venv")
    without = _pytest_version_s(python, project)
    help_before = _run([str(python), "-m", "pytest", "--help"], cwd=project).stdout
    markers_before = _run([str(python), "-m", "pytest", "--markers"], cwd=project).stdout

    # 3. installed, not opted in: nothing changes; opted in: the options are there
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=project)
    _run([str(python), "-m", "pip", "check"], cwd=project)
    with_plugin = _pytest_version_s(python, project)
    print(f"\npytest --version, median of 7: {without:.3f} s without the harness, {with_plugin:.3f} s with it "
          f"installed and not opted in ({with_plugin - without:+.3f} s); wheel {wheel.stat().st_size} bytes, "
          f"{len(names)} files")
    record_property("pytest_version_s_without", round(without, 3))
    record_property("pytest_version_s_with", round(with_plugin, 3))
    assert _run([str(python), "-m", "pytest", "--help"], cwd=project).stdout == help_before
    assert _run([str(python), "-m", "pytest", "--markers"], cwd=project).stdout == markers_before
    theirs = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_theirs.py"], cwd=project)
    assert "1 passed" in theirs.stdout
    opted_help = _run([str(python), "-m", "pytest", "-p", "ckpt_harness", "--help"], cwd=project).stdout
    assert opted_help != help_before and "--harness-impl" in opted_help and "\n  --impl" not in opted_help

    # 4. the main job from elsewhere: the same outcome and verdict, case by case, as the checkout
    version = _run([str(python), "-m", "harness", "--version"], cwd=project).stdout
    assert version.startswith(f"ckpt-rng-harness {__version__} ")
    installed = _run([str(python), "-m", "harness", "run", "--impl", "bundled,torch", "--device", "cpu", "-q",
                      "--report-dir", str(project / "installed")], cwd=project)
    checkout = _run([sys.executable, "-m", "harness", "run", "--impl", "bundled,torch", "--device", "cpu", "-q",
                     "--report-dir", str(tmp_path / "checkout")], cwd=ROOT)
    assert installed.stdout.splitlines()[-2].split(" in ")[0] == checkout.stdout.splitlines()[-2].split(" in ")[0]
    found, wanted = _verdicts(project / "installed"), _verdicts(tmp_path / "checkout")
    assert len(found) == len(wanted) > 400
    assert {key: value for key, value in found.items() if wanted.get(key) != value} == {}
    assert {r["env"]["harness"] for r in _records(project / "installed")} == {__version__}
    environment_table = (project / "installed" / "summary.md").read_text()
    assert any(line.startswith("| harness ") and f"| {__version__} " in line for line in environment_table.splitlines())

    # 5. a third party's adapter and its own expectations, by name in the CLI and under pytest
    plugin_wheel = _build_from_sdist(FIXTURE_PACKAGE, tmp_path / "fixture-dist")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(plugin_wheel)], cwd=project)
    listed = _run([str(python), "-m", "harness", "list", "--impls"], cwd=project).stdout
    assert any(line.startswith(THIRD_PARTY_IMPL) and "thirdparty-ckpt 1.4.2" in line for line in listed.splitlines())
    by_name = _run([str(python), "-m", "harness", "run", "--impl", THIRD_PARTY_IMPL, "--device", "cpu", "-q",
                    "--report-dir", str(project / "theirs")], cwd=project)
    records = [r for r in _records(project / "theirs") if r["outcome"] != "unsupported"]
    assert {r["impl_version"] for r in records} == {"1.4.2"}
    xfails = sum(r["verdict"] == "xfail" for r in records)
    assert xfails > 10 and {r["verdict"] for r in records} == {"pass", "xfail"}, by_name.stdout[-2000:]
    under_pytest = _run([str(python), "-m", "pytest", "-p", "ckpt_harness", "-p", "no:cacheprovider", "-q",
                         "--pyargs", "harness.pytest_cases", "--harness-impl", THIRD_PARTY_IMPL,
                         "--harness-device", "cpu", "--harness-report-dir", str(project / "theirs-pytest")],
                        cwd=project)
    assert f"{xfails} xfailed" in under_pytest.stdout.splitlines()[-1]
    for command in readme_commands():  # what the README tells a project to run, with the fixture's impl
        _run([str(python), *command], cwd=project)
    by_path = _run([str(python), "-m", "harness", "run", "--impl", "thirdparty_ckpt.adapter:factory", "--device",
                    "cpu", "-q", "--report-dir", str(project / "by-path")], cwd=project, check=False)
    assert by_path.returncode == 1
    assert sum(r["verdict"] == "fail" for r in _records(project / "by-path")) == xfails


def test_the_checkout_reads_the_shipped_files_through_the_package():
    """What `harness.data` finds is what contributors edit in cases/ (links in a checkout)."""
    for name in ("expectations.toml", "corpus.toml", "machines/h200-torch2.11.json", "machines/cpu-torch2.13.json"):
        assert shipped_data.shipped(name).read_bytes() == (ROOT / "cases" / name).read_bytes(), name
    assert shipped_data.machine_names() == ["cpu-torch2.13", "h100-torch2.11", "h200-torch2.11"]
    assert shipped_data.machine_file("h200-torch2.11") == shipped_data.path("machines/h200-torch2.11.json")
    assert shipped_data.machine_file("../expectations") is None and shipped_data.machine_file("nope") is None
