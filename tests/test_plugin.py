"""The pytest plugin, driven as a user would: a subprocess pytest over cases/ in the repo root."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from expectation_files import EXPECT_ERROR, EXPECT_MISMATCH, EXPECT_STALE, RAISE, expectations_file
from faulty_adapters import ADAPTER_FAULTS

ROOT = Path(__file__).resolve().parent.parent
PROCESS_LIMIT_S = 300  # a whole nested pytest run, however loaded the machine; never a speed test
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p))  # faulty_adapters importable
NO_RANDOMLY = ("-p", "no:randomly") if importlib.util.find_spec("pytest_randomly") else ()


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", *NO_RANDOMLY,
                           *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=PROCESS_LIMIT_S)


def records(report_dir: Path) -> dict[tuple[str, str], dict]:
    lines = (report_dir / "results.jsonl").read_text().splitlines()
    return {(r["impl"], r["case_id"]): r for r in map(json.loads, lines)}


def test_unknown_impl_is_one_line_and_exit_2(tmp_path):
    proc = pytest_run("--impl", "nope", "--report-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "error: unknown implementation 'nope'" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


def test_known_failures_are_strict_xfails_and_reach_the_report(tmp_path):
    proc = pytest_run("--impl", "torch,bundled", "--device", "cpu", "--program", "flat", "-k", "flat-none",
                      "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "14 passed, 20 deselected, 6 xfailed" in proc.stdout
    got = records(tmp_path)
    assert got[("torch", "reentrant-tracked-eager-flat-none-cpu")]["verdict"] == "xfail"
    assert got[("bundled", "reentrant-tracked-eager-flat-none-cpu")]["verdict"] == "pass"


def test_an_unexpected_mismatch_fails_with_the_mismatch_message(tmp_path):
    empty = tmp_path / "none.toml"
    empty.write_text("")
    proc = pytest_run("--impl", "neg-no-rewind", "--device", "cpu", "-k", "reentrant-default-eager-flat-none",
                      "--expectations", str(empty), "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert "recompute-mask s0 iteration 0: Mismatched elements:" in proc.stdout
    assert "first at index" in proc.stdout


def test_xdist_workers_and_a_single_process_give_the_same_report(tmp_path):
    args = ("--impl", "bundled,neg-no-restore", "--device", "cpu", "-k", "nested")
    serial = pytest_run(*args, "-n", "0", "--report-dir", str(tmp_path / "serial"))
    parallel = pytest_run(*args, "-n", "2", "--report-dir", str(tmp_path / "parallel"))
    assert serial.returncode == parallel.returncode == 0, parallel.stdout[-2000:]
    a, b = records(tmp_path / "serial"), records(tmp_path / "parallel")
    assert len(a) == 40 and a.keys() == b.keys()
    for key in a:
        assert (a[key]["outcome"], a[key]["verdict"], a[key]["mismatches"]) == \
               (b[key]["outcome"], b[key]["verdict"], b[key]["mismatches"]), key
    assert {r["worker"] for r in b.values()} == {"gw0", "gw1"}


def failures(stdout: str) -> dict[str, str]:
    """pytest's failure sections by test parameter id ('<impl>-<case id>')."""
    parts = re.split(r"^_+ test_case\[(.+?)\] _+$", stdout, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n= ", 1)[0] for i in range(1, len(parts) - 1, 2)}


# --- bad input: exit 2, one line, no INTERNALERROR ----------------------------------------------------


def assert_one_error_line(proc: subprocess.CompletedProcess, message: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert "INTERNALERROR" not in output and "Traceback" not in output, output[-2000:]
    assert output.count("\n") == 1 and output.count("error:") == 1, output
    assert message in output


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what happens where no CUDA device is visible")
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    proc = pytest_run("--device", "cuda", "--report-dir", str(tmp_path / "r"))
    assert_one_error_line(proc, "--device cuda: no CUDA device is visible")
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None, reason="megatron-core is installed")
def test_a_named_impl_whose_package_is_missing_is_exit_2(tmp_path):
    proc = pytest_run("--impl", "megatron", "--report-dir", str(tmp_path / "r"))
    assert_one_error_line(proc, "implementation 'megatron' cannot run here")
    assert "--allow-unsupported" in proc.stderr


def test_an_impl_module_that_raises_at_import_is_one_line_and_exit_2(tmp_path):
    proc = pytest_run("--impl", "broken_import_adapter:factory", "--report-dir", str(tmp_path / "r"))
    assert_one_error_line(proc, "cannot import 'broken_import_adapter' for implementation "
                                "'broken_import_adapter:factory': RuntimeError: boom while importing the adapter")


# --- impls that ran nothing; impls that must support everything ----------------------------------------


def test_an_impl_that_declines_every_case_fails_the_run_unless_allowed(tmp_path):
    impl = "faulty_adapters:make_decline_all"
    proc = pytest_run("--impl", impl, "--device", "cpu", "--report-dir", str(tmp_path / "a"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    assert re.search(rf"^harness error: {impl}: none of its \d+ selected cases ran \(e\.g\. declines everything\)$",
                     proc.stdout, re.M), proc.stdout[-2000:]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    allowed = pytest_run("--impl", impl, "--device", "cpu", "--allow-unsupported", "--report-dir", str(tmp_path / "b"))
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr
    assert "harness error" not in allowed.stdout


def test_bundled_like_impls_must_support_every_case(tmp_path):
    impl = "faulty_adapters:make_bundled_declining_one"
    proc = pytest_run("--impl", impl, "--device", "cpu", "--program", "flat", "-m", "default",
                      "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 failed, 3 passed" in proc.stdout
    failed = failures(proc.stdout)
    assert list(failed) == [f"{impl}-reentrant-default-eager-flat-none-cpu"]
    assert f"{impl} must support every valid case" in failed[f"{impl}-reentrant-default-eager-flat-none-cpu"]


# --- expectations: wrong failures, known failures, stale entries ----------------------------------------

RAISE_K = "make_raise-reentrant-tracked-eager-flat-none"  # the one case: the impl prefix keeps nonreentrant out


def test_a_failure_other_than_the_expected_one_is_a_wrong_failure(tmp_path):
    expected = str(expectations_file(tmp_path, EXPECT_MISMATCH))
    proc = pytest_run("--impl", RAISE, "--device", "cpu", "--expectations", expected, "-k", RAISE_K,
                      "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 failed" in proc.stdout
    [failed] = failures(proc.stdout).values()
    assert "wrong failure: expected mismatch, got error: RuntimeError: faulty adapter: raised on purpose" in failed
    assert f"rerun: python -m harness repro reentrant-tracked-eager-flat-none-cpu --impl {RAISE}" in failed
    [record] = records(tmp_path / "r").values()
    assert (record["impl"], record["verdict"]) == (RAISE, "fail")


def test_the_expected_failure_is_an_xfail(tmp_path):
    expected = str(expectations_file(tmp_path, EXPECT_ERROR))
    proc = pytest_run("--impl", RAISE, "--device", "cpu", "--expectations", expected, "-k", RAISE_K,
                      "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "1 xfailed" in proc.stdout and "failed" not in proc.stdout.replace("xfailed", "")
    [record] = records(tmp_path / "r").values()
    assert (record["impl"], record["verdict"]) == (RAISE, "xfail")


def test_a_stale_expectation_fails_the_run(tmp_path):
    expected = str(expectations_file(tmp_path, EXPECT_STALE))
    proc = pytest_run("--impl", "bundled", "--device", "cpu", "--expectations", expected,
                      "-k", "bundled-reentrant-default-eager-flat-none-cpu", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stdout[-2000:]
    [failed] = failures(proc.stdout).values()
    assert "stale: expected mismatch, but the case passed" in failed


# --- adapter faults fail their test, they do not crash pytest ---------------------------------------------



def test_adapter_faults_fail_their_tests_with_the_fault(tmp_path):
    case = "reentrant-default-eager-flat-none-cpu"
    proc = pytest_run("--impl", ",".join(ADAPTER_FAULTS), "--device", "cpu",
                      "-k", f"{case} and not nonreentrant", "--report-dir", str(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "INTERNALERROR" not in output
    assert f"{len(ADAPTER_FAULTS)} failed" in proc.stdout
    failed = failures(proc.stdout)
    assert failed.keys() == {f"{impl}-{case}" for impl in ADAPTER_FAULTS}
    for impl, message in ADAPTER_FAULTS.items():
        assert f"{impl} {case}: error (fail)\n{message}" in failed[f"{impl}-{case}"], failed[f"{impl}-{case}"]


# --- markers select exact axis values; -k matches substrings ---------------------------------------------


def collected(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    return re.findall(r"^cases/test_matrix\.py::test_case\[(.+)\]$", proc.stdout, re.M)


def test_axis_markers_select_exactly_those_cells_where_k_would_not(tmp_path):
    by_marker = collected(pytest_run("--impl", "bundled", "--device", "cpu", "-m", "tracked and nested",
                                     "--collect-only", "--report-dir", str(tmp_path / "m")))
    assert sorted(by_marker) == sorted(f"bundled-{mode}-tracked-eager-nested-{interleave}-cpu"
                                       for mode in ("reentrant", "nonreentrant") for interleave in ("none", "draws"))
    by_keyword = collected(pytest_run("--impl", "bundled", "--device", "cpu", "-k", "tracked and nested",
                                      "--collect-only", "--report-dir", str(tmp_path / "k")))
    assert set(by_marker) < set(by_keyword)
    assert sorted(set(by_keyword) - set(by_marker)) == sorted(
        f"bundled-{mode}-untracked-eager-nested-{interleave}-cpu"
        for mode in ("reentrant", "nonreentrant") for interleave in ("none", "draws"))


def test_a_corrupt_corpus_is_one_line_and_exit_2_not_an_internal_error(tmp_path):
    corrupt = tmp_path / "corpus.toml"
    corrupt.write_text('[[finding]]\ncase = "not a case"\nimpl = "torch"\noutcome = "x"\nfound = "2026-12-04"\n')
    env = dict(ENV, HARNESS_TEST_CORPUS=str(corrupt))
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", *NO_RANDOMLY,
                           "-p", "corpus_path_plugin", "--report-dir", str(tmp_path / "r")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_LIMIT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]
    assert "INTERNALERROR" not in out and "Traceback" not in out
    assert f"error: {corrupt}" in out or "finding 1" in out
