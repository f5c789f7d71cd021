"""The command line: exit statuses, one-line errors, and what `run` writes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from expectation_files import EXPECT_ERROR, EXPECT_MISMATCH, EXPECT_STALE, RAISE, expectations_file
from faulty_adapters import ADAPTER_FAULTS

from harness.fronts.cli import main
from harness.report import repro_command

ROOT = Path(__file__).resolve().parent.parent
PROCESS_LIMIT_S = 300  # a whole subprocess run, however loaded the machine; never a speed test
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p))  # faulty_adapters importable

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what happens where no CUDA device is visible")


def not_installed(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is not None,
                              reason=f"asserts what happens where {module} is not installed")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=PROCESS_LIMIT_S)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command prints on stderr (asserting that it is one, without a traceback)."""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def records(report_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]


def attention(report_dir: Path) -> str:
    """The "Needs attention" section of summary.md."""
    text = (report_dir / "summary.md").read_text()
    return text.split("## Needs attention", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--impl", "nope", "--device", "cpu"], "unknown implementation 'nope'; known: accelerate-fsdp2, "),
        (["run", "--layout", "trackd", "--device", "cpu"], "unknown layout 'trackd'; valid values: default"),
        (["list", "--device", "gpu"], "unknown device 'gpu'; valid values: auto, cpu, cuda"),
        (["repro", "not-a-case"], "bad case id 'not-a-case'"),
        (["repro", "reentrant-default-single-flat-none-cpu"], "CUDA graph capture needs a cuda device"),
        (["run", "--device", "cpu", "--report-dir", "/etc/hostname/sub"], "is not a directory"),
        (["report", "/nonexistent/dir"], "no results.jsonl in /nonexistent/dir"),
        (["run", "--impl", "harness.impls.bundled:nothing", "--device", "cpu"], "has no attribute 'nothing'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr


def test_list_prints_the_selected_ids(capsys):
    assert main(["list", "--device", "cpu", "--layout", "shared", "--program", "flat"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == [
        "reentrant-shared-eager-flat-none-cpu", "reentrant-shared-eager-flat-draws-cpu",
        "nonreentrant-shared-eager-flat-none-cpu", "nonreentrant-shared-eager-flat-draws-cpu",
    ]


def test_run_writes_the_stable_schema_and_exits_0_when_failures_are_expected(tmp_path, capsys):
    status = main(["run", "--impl", "bundled,torch", "--device", "cpu", "--layout", "tracked",
                   "--program", "flat", "--report-dir", str(tmp_path), "-q"])
    assert status == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8
    for key in ("case_id", "impl", "device", "outcome", "mismatches", "verdict", "env", "duration_s"):
        assert all(key in r for r in records), key
    verdicts = {(r["impl"], r["verdict"]) for r in records}
    assert verdicts == {("bundled", "pass"), ("torch", "xfail")}
    assert (tmp_path / "summary.md").read_text().startswith("# Checkpoint RNG harness report")


def test_run_exits_1_on_an_unexpected_failure(tmp_path, capsys):
    empty = tmp_path / "none.toml"
    empty.write_text("")
    status = main(["run", "--impl", "torch", "--device", "cpu", "--case", "reentrant-tracked-eager-flat-none-cpu",
                   "--expectations", str(empty), "--report-dir", str(tmp_path / "r"), "-q"])
    assert status == 1


def test_repro_exits_1_on_a_failing_case_and_0_on_a_passing_one(capsys):
    assert main(["repro", "nonreentrant-tracked-eager-flat-none-cpu", "--impl", "torch"]) == 1
    out = capsys.readouterr().out
    assert "recompute-mask s0 iteration 0: Mismatched elements:" in out
    assert main(["repro", "nonreentrant-tracked-eager-flat-none-cpu", "--impl", "bundled"]) == 0


# --- what this machine cannot run is bad input: exit 2, one line ----------------------------------

CUDA_CASE = "reentrant-default-eager-flat-none-cuda"
CAPTURE_NEEDS_CUDA = "--capture single needs CUDA graphs, which need a CUDA device"


@no_cuda
@pytest.mark.parametrize(
    "args, messages",
    [
        (["run", "--device", "cuda"], ["--device cuda: no CUDA device is visible"]),
        (["repro", CUDA_CASE], [f"case {CUDA_CASE} needs a CUDA device"]),
        (["bench", "--device", "cuda"], ["--device cuda: no CUDA device is visible"]),
        (["run", "--capture", "single"], [CAPTURE_NEEDS_CUDA]),
        (["run", "--capture", "single", "--device", "cpu"], [CAPTURE_NEEDS_CUDA]),
    ],
    ids=["run-cuda", "repro-cuda-case", "bench-cuda", "run-capture", "run-capture-cpu"],
)
def test_what_needs_cuda_is_bad_input_without_a_gpu(args, messages, tmp_path):
    if args[0] == "run":
        args = [*args, "--report-dir", str(tmp_path / "r")]
    elif args[0] == "bench":
        args = [*args, "--json", str(tmp_path / "bench.json")]
    proc = cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc)
    assert line.startswith("error: ")
    for message in messages:
        assert message in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "bench.json").exists()


@not_installed("megatron")
def test_run_of_a_named_impl_whose_package_is_missing_is_bad_input(tmp_path):
    proc = cli("run", "--impl", "megatron", "--device", "cpu", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc)
    assert "implementation 'megatron' cannot run here" in line and "No module named 'megatron'" in line
    assert "--allow-unsupported" in line
    assert not (tmp_path / "r").exists()


@not_installed("transformer_engine")
def test_repro_of_an_impl_whose_package_is_missing_is_bad_input():
    proc = cli("repro", "reentrant-default-eager-flat-none-cpu", "--impl", "transformer-engine")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "implementation 'transformer-engine' cannot run here" in one_line(proc)


# --- unsupported cells: allowed where asked for, listed in the report --------------------------------


@not_installed("megatron")
def test_allow_unsupported_runs_a_missing_package_and_the_report_lists_why(tmp_path):
    proc = cli("run", "--impl", "megatron", "--allow-unsupported", "--device", "cpu", "--layout", "tracked",
               "--program", "flat,nested,siblings", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = records(tmp_path)
    assert len(got) == 12 and {r["outcome"] for r in got} == {"unsupported"}
    section = attention(tmp_path)
    assert "Nothing" not in section
    assert re.search(r"- megatron: 12 unsupported — megatron-core does not import .*"
                     r"ModuleNotFoundError: No module named 'megatron' \(12\)", section), section


@not_installed("megatron")
@not_installed("transformer_engine")
def test_impls_that_all_brought_in_may_be_unsupported(tmp_path):
    proc = cli("run", "--impl", "all", "--device", "cpu", "--layout", "tracked", "--program", "flat",
               "--interleave", "none", "--no-isolate", "-q", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    external = ("megatron", "megatron-graphsafe", "transformer-engine")
    by_impl: dict[str, set[str]] = {}
    for record in records(tmp_path):
        by_impl.setdefault(record["impl"], set()).add(record["outcome"])
    assert all(by_impl[name] == {"unsupported"} for name in external), by_impl
    assert by_impl["bundled"] == {"pass"}
    section = attention(tmp_path)
    assert "Nothing" not in section
    for name in external:
        assert re.search(rf"^- {re.escape(name)}: 2 unsupported — .*does not import", section, re.M), section


# --- an impl that ran none of its cases proved nothing -------------------------------------------------


def test_an_impl_that_declines_every_case_fails_the_run_unless_allowed(tmp_path):
    impl = "faulty_adapters:make_decline_all"
    proc = cli("run", "--impl", impl, "--device", "cpu", "-q", "--report-dir", str(tmp_path / "a"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.fullmatch(rf"error: {impl}: none of its \d+ selected cases ran \(e\.g\. declines everything\)\n",
                        proc.stderr), proc.stderr
    assert {r["outcome"] for r in records(tmp_path / "a")} == {"unsupported"}
    allowed = cli("run", "--impl", impl, "--device", "cpu", "-q", "--allow-unsupported",
                  "--report-dir", str(tmp_path / "b"))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "none of its" not in allowed.stderr


def test_bundled_like_impls_must_support_every_case(tmp_path):
    impl = "faulty_adapters:make_bundled_declining_one"
    proc = cli("run", "--impl", impl, "--device", "cpu", "--layout", "default", "--program", "flat",
               "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = {r["case_id"]: r for r in records(tmp_path)}
    assert len(got) == 4
    declined = got["reentrant-default-eager-flat-none-cpu"]
    assert (declined["outcome"], declined["verdict"]) == ("unsupported", "fail")
    assert declined["verdict_note"].startswith(f"{impl} must support every valid case")
    assert declined["verdict_note"].endswith(": declined on purpose")
    assert {r["verdict"] for cid, r in got.items() if cid != declined["case_id"]} == {"pass"}


# --- expectations: wrong failures, known failures, stale entries ----------------------------------------

RAISE_CASE = "reentrant-tracked-eager-flat-none-cpu"


def test_a_failure_other_than_the_expected_one_is_a_wrong_failure(tmp_path):
    proc = cli("run", "--impl", RAISE, "--case", RAISE_CASE, "--no-isolate", "--report-dir", str(tmp_path / "r"),
               "--expectations", str(expectations_file(tmp_path, EXPECT_MISMATCH)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [record] = records(tmp_path / "r")
    assert (record["outcome"], record["verdict"]) == ("error", "fail")
    assert record["verdict_note"].startswith(
        "wrong failure: expected mismatch, got error: RuntimeError: faulty adapter: raised on purpose")
    assert record["impl"] == RAISE  # the name given on the command line, not the adapter's own
    assert "wrong failure: expected mismatch" in (tmp_path / "r" / "summary.md").read_text()


def test_the_rerun_line_of_a_record_reproduces_it(tmp_path):
    proc = cli("run", "--impl", RAISE, "--case", RAISE_CASE, "--no-isolate", "-q", "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [record] = records(tmp_path)
    command = repro_command(record)
    assert command == f"python -m harness repro {RAISE_CASE} --impl {RAISE}"
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "harness"]
    rerun = cli(*argv[3:])
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert rerun.stdout.startswith(f"{RAISE} {RAISE_CASE}: error (")
    assert "RuntimeError: faulty adapter: raised on purpose" in rerun.stdout


def test_the_expected_failure_is_an_xfail(tmp_path):
    proc = cli("run", "--impl", RAISE, "--case", RAISE_CASE, "--no-isolate", "--report-dir", str(tmp_path / "r"),
               "--expectations", str(expectations_file(tmp_path, EXPECT_ERROR)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [record] = records(tmp_path / "r")
    assert (record["outcome"], record["verdict"], record["impl"]) == ("error", "xfail", RAISE)


def test_a_stale_expectation_fails_the_run(tmp_path):
    proc = cli("run", "--impl", "bundled", "--case", "reentrant-default-eager-flat-none-cpu", "--no-isolate",
               "--report-dir", str(tmp_path / "r"), "--expectations", str(expectations_file(tmp_path, EXPECT_STALE)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^\[1/1\] stale\s+pass\s+bundled reentrant-default-eager-flat-none-cpu$", proc.stdout, re.M)
    [record] = records(tmp_path / "r")
    assert (record["outcome"], record["verdict"]) == ("pass", "stale")
    assert record["verdict_note"].startswith("stale: expected mismatch, but the case passed")
    assert "stale: expected mismatch, but the case passed" in (tmp_path / "r" / "summary.md").read_text()


# --- adapter faults are results, not crashes -----------------------------------------------------------

FAULT_CASE = "reentrant-default-eager-flat-none-cpu"


def test_adapter_faults_are_error_results_naming_the_adapter_as_given(tmp_path):
    proc = cli("run", "--no-isolate", "--case", FAULT_CASE, "--impl", ",".join(ADAPTER_FAULTS), "-q",
               "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    got = {r["impl"]: r for r in records(tmp_path)}
    assert got.keys() == ADAPTER_FAULTS.keys()
    for impl, error in ADAPTER_FAULTS.items():
        assert (got[impl]["outcome"], got[impl]["verdict"]) == ("error", "fail"), impl
        assert got[impl]["error"].startswith(error), got[impl]["error"]
        assert "\n" not in got[impl]["error"]


def test_an_isolated_case_names_the_adapter_as_given_too(tmp_path):
    impl = "faulty_adapters:make_returns_tuple"
    proc = cli("run", "--case", FAULT_CASE, "--impl", impl, "-q", "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [record] = records(tmp_path)
    assert (record["impl"], record["outcome"]) == (impl, "error")
    assert record["error"].startswith(ADAPTER_FAULTS[impl]), record["error"]


def test_the_command_line_does_not_import_pytest(tmp_path):
    probe = ("import runpy, sys\n"
             f"sys.argv = ['harness', 'run', '--device', 'cpu', '--layout', 'default', '--program', 'flat',"
             f" '--no-isolate', '-q', '--report-dir', {str(tmp_path)!r}]\n"
             "try:\n    runpy.run_module('harness', run_name='__main__')\nexcept SystemExit as exc:\n"
             "    print('exit', exc.code)\n"
             "print('pytest imported:', any(m == 'pytest' or m.startswith('_pytest') for m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "exit 0" in proc.stdout, proc.stdout + proc.stderr
    assert "pytest imported: False" in proc.stdout


def test_an_auto_device_run_says_which_device_and_require_cuda_refuses_the_cpu_subset(tmp_path, capsys, monkeypatch):
    # No GPU here: the main command's first line says it runs the CPU subset and why; a GPU CI job
    # (--require-cuda, or HARNESS_REQUIRE_CUDA=1) exits 2 instead of passing green on the CPU.
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a visible CUDA device")
    args = ["run", "--impl", "bundled", "--program", "flat", "--mode", "reentrant", "--layout", "default",
            "--interleave", "none", "-q", "--no-isolate", "--report-dir", str(tmp_path / "r"), "--replace-report"]
    assert main(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("device: no CUDA device visible") and "running the CPU subset, 1 cases" in first
    assert main([*args, "--require-cuda"]) == 2
    assert "--require-cuda: no CUDA device is visible" in capsys.readouterr().err
    monkeypatch.setenv("HARNESS_REQUIRE_CUDA", "1")
    assert main(args) == 2
    monkeypatch.setenv("HARNESS_REQUIRE_CUDA", "0")
    assert main(args) == 0


def test_version_and_the_list_of_impls(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert re.match(r"ckpt-rng-harness \S+ \(torch \S+\)", capsys.readouterr().out)
    assert main(["list", "--impls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    from harness import impls

    assert [line.split()[0] for line in lines] == sorted(impls.registered())
    assert any(line.startswith("bundled ") and " available " in line for line in lines)
    decorator = next(line for line in lines if line.startswith("torch-decorator "))
    assert " available " in decorator or "unavailable: this torch's checkpoint has no decorator form" in decorator


def test_an_output_file_in_a_folder_that_does_not_exist_is_made_before_the_work(tmp_path, capsys):
    script = tmp_path / "new" / "deeper" / "repro.py"
    assert main(["repro", "nonreentrant-default-eager-flat-none-cpu", "--impl", "bundled",
                 "--script", str(script)]) == 0
    assert script.is_file()
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["repro", "nonreentrant-default-eager-flat-none-cpu", "--impl", "bundled",
                 "--script", str(blocked / "repro.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--script" in err and "is not a directory" in err


def test_bench_with_cases_runs_that_many_and_nothing_else(tmp_path, monkeypatch, capsys):
    # `bench --cases 3` must not time the whole default matrix in a hidden subprocess
    from harness.fronts import bench

    monkeypatch.setattr(bench, "_default_matrix_wall", lambda *a: pytest.fail("the default matrix ran"))
    monkeypatch.setattr(bench, "bare_seconds", lambda case, impl: 0.001)  # the bare rerun is not under test here
    out = tmp_path / "new" / "bench.json"
    assert main(["bench", "--impl", "bundled", "--device", "cpu", "--cases", "3", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["cases_run"] == 3 and figures["default_matrix_wall_s_from_process_start"] is None
    assert "not measured (--cases N)" in capsys.readouterr().out
    rows = figures["memory_by_pass"]  # after the warm-up, then after the (partial) pass
    assert [(r["pass"], r["cases"]) for r in rows] == [(0, 0), (1, 3)] and rows[-1]["host_rss_MiB"] > 0
    assert figures["memory_flat"]["host_rss_MiB"].startswith("not measured (fewer than two passes")
    # the profile of a warm pass covers the cases the bench ran, not the whole matrix
    assert figures["profile"]["cases"] == 3 and figures["kernel_ms_not_measured"] is None


def test_bench_says_whether_memory_stayed_flat_over_the_second_half_of_the_run():
    from harness.fronts.bench import flatness

    rows = [{"pass": p, "cases": 370 * p, "reserved_MiB": r, "allocated_MiB": a, "host_rss_MiB": h}
            for p, r, a, h in [(0, 10, 1, 900), (1, 500, 2, 1000), (2, 1000, 2, 1050), (3, 1000, 2, 1090),
                               (4, 2100, 2, 1100)]]
    verdicts = flatness(rows)
    assert verdicts["reserved_MiB"] == ("growing: 1000 after pass 2 (740 cases), 2100 after pass 4 (1480 cases), "
                                        "+110.0%")
    assert verdicts["allocated_MiB"].startswith("flat: 2 after pass 2") and verdicts["host_rss_MiB"].startswith("flat")
    no_cuda = [{**row, "reserved_MiB": None} for row in rows]
    assert flatness(no_cuda)["reserved_MiB"] == "no CUDA"


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-3"])
def test_a_case_timeout_that_is_no_positive_number_is_one_line(value, tmp_path, capsys):
    assert main(["run", "--impl", "bundled", "--device", "cpu", "--program", "flat", "--case-timeout", value,
                 "--report-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--case-timeout must be a positive number of seconds" in err


def test_bench_times_the_matrix_with_n_workers_and_checks_their_verdicts(monkeypatch):
    from harness.fronts import bench
    from harness.run.execution import load_targets
    from harness.verdict import expectations

    [target] = load_targets(["bundled"])
    from harness.model.cases import parse_case_id

    cases = [parse_case_id(c) for c in ("reentrant-tracked-eager-flat-none-cpu",
                                        "nonreentrant-default-eager-flat-none-cpu")]
    row = bench.pool_throughput(target, cases, expectations.load(), 2)
    assert row["workers"] == 2 and row["cases"] == 2 and row["verdicts_differ_between_passes"] == 0
    assert row["cases_per_s"] > 0 and row["first_pass_s"] > 0


def test_bench_sets_each_figure_beside_its_target():
    from harness.fronts import bench
    from harness.fronts.bench import against_targets

    figures = {
        "per_capture": [{"capture": "eager", "pass": 2, "cases": 100, "ran": 100, "cases_per_s": 50.0,
                         "harness_over_bare": 1.1},
                        {"capture": "single", "pass": 2, "cases": 100, "ran": 100, "cases_per_s": 25.0,
                         "harness_over_bare": 1.3},
                        # a capture mode where every case was a declared limit: no rate, and none counted
                        {"capture": "separate", "pass": 2, "cases": 100, "ran": 0, "cases_per_s": None,
                         "harness_over_bare": None}],
        "workers": [{"workers": 4, "cases_per_s": 90.0}, {"workers": 8, "cases_per_s": 320.0}],
        "fuzz": {"programs_per_s": 42.0},
        "memory_flat": {"reserved_MiB": "flat: 1 after pass 2 (740 cases), 1 after pass 4 (1480 cases), +0.0%",
                        "allocated_MiB": "growing: 1 after pass 2 (740 cases), 2 after pass 4 (1480 cases), +100.0%",
                        "host_rss_MiB": "not measured (fewer than two passes over the matrix)"},
    }
    rows = {row["figure"]: (row["measured"], row["met"]) for row in against_targets(figures)}
    assert rows["cases/s, one process (pass 2; cases that ran)"] == (33.3, False)  # 200 cases in 2 + 4 s
    assert rows["cases/s, 8 isolated workers"] == (320.0, True)  # issue 42: >= 300 with eight
    assert rows["harness/bare, eager"] == (1.1, True) and rows["harness/bare, single"] == (1.3, False)  # <= 1.2
    assert rows["harness/bare, separate"] == (None, "-")
    assert rows["fuzz programs/s, one search"] == (42.0, False)  # >= 50
    assert bench.worker_overhead_ms({**figures, "workers": [{"workers": 1, "cases_per_s": 20.0}]}) == \
        pytest.approx(50.0 - 1e3 * 6 / 200)  # 50 ms a case in one worker, 30 in this process
    assert rows["reserved_MiB over the second half"] == ("+0.0%", True)
    assert rows["allocated_MiB over the second half"] == ("+100.0%", False)
    assert rows["host_rss_MiB over the second half"][1] == "-"
    # fewer than eight workers: the eight-worker target is not judged on them
    fewer = against_targets({**figures, "workers": [{"workers": 4, "cases_per_s": 400.0}]})
    assert {r["figure"]: r["met"] for r in fewer}["cases/s, 4 isolated workers"] == "-"


def test_a_bench_of_cases_that_did_not_run_gives_no_figure(tmp_path, capsys, monkeypatch):
    # issue 59: every case a declared limit printed thousands of cases/s and "met True"
    # (torchtune-ac is non-reentrant only, and the first CPU case is reentrant: on every torch)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--impl", "torchtune-ac", "--device", "cpu", "--cases", "1", "--json",
                 str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bench: none of the 1 cases ran under torchtune-ac (e.g. unsupported: torchtune's ")
    assert not (tmp_path / "b.json").exists()
    assert main(["bench", "--impl", "bundled", "--device", "cpu", "--cases", "1", "--jobs", ""]) == 2
    assert capsys.readouterr().err.strip() == "error: --jobs: every count must be at least 1, got ''"
    assert list(tmp_path.iterdir()) == []


def test_bench_profile_sums_a_passs_own_time_by_what_spends_it():
    from harness.fronts import bench_limit
    from harness.model.cases import parse_case_id
    from harness.run.execution import load_targets, run_case
    from harness.verdict import expectations

    [target] = load_targets(["bundled"])
    entries = expectations.load()
    case = parse_case_id("nonreentrant-tracked-eager-flat-none-cpu")
    profile = bench_limit.where_time_goes(lambda: len([run_case(target, case, entries) for _ in range(2)]))
    parts = {row["part"]: row for row in profile["parts"]}
    assert profile["cases"] == 2
    # a case runs its workload, its oracles and torch's C++: each shows, with its time per case
    for part in (bench_limit.TORCH_CPP, "oracles and records (mask copies, comparisons)",
                 "program: build and workload (sites, regions, tensors)"):
        assert parts[part]["seconds"] > 0 and parts[part]["ms_per_case"] == pytest.approx(
            parts[part]["seconds"] * 1e3 / 2, abs=0.5)  # (seconds are rounded to 1 ms)
    assert [r["seconds"] for r in profile["parts"]] == sorted((r["seconds"] for r in profile["parts"]), reverse=True)
    # no GPU, no kernel time: said as nothing measured, not as zero
    assert bench_limit.kernel_ms_by_capture(target, [case], entries) == {}


def test_bench_profile_parts_follow_the_files_that_spend_the_time():
    from harness.fronts.bench_limit import HARNESS, OTHER, TORCH_CPP, TORCH_PY, WAITING, _part
    from harness.run.runner import TORCH_DIR

    assert _part(HARNESS + "check/oracles.py", "check") == "oracles and records (mask copies, comparisons)"
    assert _part(HARNESS + "run/ambient.py", "snapshot") == "ambient snapshots"
    assert _part(HARNESS + "run/runner.py", "run") == "runner (sessions, references, isolation)"
    assert _part(TORCH_DIR + "autograd/graph.py", "backward") == TORCH_PY
    assert _part("~", "<built-in method torch._C._cuda_synchronize>") == WAITING
    assert _part("~", "<method 'item' of 'torch._C.TensorBase' objects>") == WAITING
    assert _part("~", "<built-in method torch.rand>") == TORCH_CPP
    assert _part("~", "<method 'acquire' of '_thread.lock' objects>") == OTHER
