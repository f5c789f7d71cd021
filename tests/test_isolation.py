"""Fault isolation: a faulty adapter that raises, hangs, aborts or segfaults is recorded, and the
run goes on (cases run in a replaceable worker process).

No test here depends on how fast a loaded machine is: every case that must finish gets a limit of
minutes (GENEROUS_S); only a hang runs under a short limit (HANG_S), which it then uses up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import faulty_adapters
import pytest

from harness.model.cases import parse_case_id
from harness.run.isolation import (
    FATAL_LINES,
    LAST_LINES,
    SUMMARY_CHARS,
    CaseWorker,
    summarize_output,
)
from harness.run.runner import Outcome

ROOT = Path(__file__).resolve().parent.parent
CASE = parse_case_id("reentrant-tracked-eager-flat-none-cpu")
GENEROUS_S = 120  # a limit no healthy case reaches, however loaded the machine
HANG_S = 15  # a hang costs this much; nothing else runs under it
PROCESS_LIMIT_S = 900  # a whole command-line run, as a last resort against a stuck test


@pytest.fixture(scope="module")
def worker():
    w = CaseWorker(timeout_s=GENEROUS_S)
    yield w
    w.close()


def _quoted_output(error: str) -> list[str]:
    """The worker output a crash result quotes, line by line."""
    assert "; its output ended with: " in error, error
    return error.split("; its output ended with: ", 1)[1].splitlines()


def test_a_raising_adapter_is_an_error_with_its_message(worker):
    result = worker.run(CASE, "faulty_adapters:make_raise", 2)
    assert result.outcome is Outcome.ERROR
    assert result.error == "RuntimeError: faulty adapter: raised on purpose"


def test_an_abort_is_a_crash_naming_the_signal_and_the_next_case_still_runs(worker):
    result = worker.run(CASE, "faulty_adapters:make_abort", 2)
    assert result.outcome is Outcome.CRASH
    assert "killed by SIGABRT" in result.error
    assert "Fatal Python error: Aborted" in result.error  # faulthandler's last words, from the log
    assert worker.run(CASE, "bundled", 2).outcome is Outcome.PASS


def test_a_segfault_is_a_crash(worker):
    result = worker.run(CASE, "faulty_adapters:make_segfault", 2)
    assert result.outcome is Outcome.CRASH
    assert "killed by SIGSEGV" in result.error


def test_the_worker_is_warm_before_the_first_case(worker):
    """torch._dynamo (imported by the first checkpoint call) is loaded before the worker is ready."""
    result = worker.run(CASE, "faulty_adapters:make_dynamo_probe", 2)
    assert result.error == "RuntimeError: torch._dynamo imported before the case: True"


# --- what a crash quotes of the worker's output ----------------------------------------------------


def test_a_crash_quotes_the_last_lines_of_output_whole(worker):
    result = worker.run(CASE, "faulty_adapters:make_noisy_exit", 2)
    assert result.outcome is Outcome.CRASH
    assert "worker process died: exited with status 3" in result.error
    expected = [faulty_adapters.noise_line(i) for i in range(faulty_adapters.NOISE_LINES)]
    assert _quoted_output(result.error) == expected[-LAST_LINES:]


def test_a_fatal_signal_quotes_faulthandlers_report_whole(worker):
    result = worker.run(CASE, "faulty_adapters:make_noisy_abort", 2)
    assert result.outcome is Outcome.CRASH and "killed by SIGABRT" in result.error
    quoted = _quoted_output(result.error)
    assert quoted[0] == "Fatal Python error: Aborted"
    assert 1 < len(quoted) <= FATAL_LINES
    assert not any("warning" in line for line in quoted)  # the noise before the report is left out
    assert any("faulty_adapters.py" in line and "checkpoint" in line for line in quoted)


def test_a_worker_that_cannot_start_quotes_its_output_whole():
    lines = [faulty_adapters.noise_line(i) for i in range(faulty_adapters.NOISE_LINES)]

    class Broken(CaseWorker):
        def _command(self):
            script = "import sys; sys.stderr.write(sys.argv[1]); sys.exit(1)"
            return [sys.executable, "-c", script, "\n".join(lines) + "\n"]

    worker = Broken(timeout_s=GENEROUS_S)
    try:
        with pytest.raises(RuntimeError) as excinfo:
            worker.run(CASE, "bundled", 2)
    finally:
        worker.close()
    message = str(excinfo.value)
    prefix = "the case worker process did not start: "
    assert message.startswith(prefix)
    assert message[len(prefix):].splitlines() == lines[-LAST_LINES:]


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([], ""),
        (["a", "b"], "a\nb"),
        ([f"l{i}" for i in range(20)], "\n".join(f"l{i}" for i in range(20 - LAST_LINES, 20))),
        (["noise", "Fatal Python error: Segmentation fault", "Current thread 0x1 (most recent call first):",
          '  File "x.py", line 3 in f'],
         'Fatal Python error: Segmentation fault\nCurrent thread 0x1 (most recent call first):\n'
         '  File "x.py", line 3 in f'),
    ],
)
def test_summarize_output_keeps_whole_lines(lines, expected):
    assert summarize_output(lines) == expected


def test_summarize_output_drops_whole_lines_beyond_its_budget():
    long = ["x" * (SUMMARY_CHARS // 3) + f" {i}" for i in range(LAST_LINES)]
    tail = summarize_output(long).splitlines()
    assert tail == long[-len(tail):] and 1 <= len(tail) < LAST_LINES
    report = ["Fatal Python error: Aborted", *long]
    head = summarize_output(report).splitlines()
    assert head == report[:len(head)] and len(head) < len(report)
    huge = ["y" * (3 * SUMMARY_CHARS)]
    assert summarize_output(huge) == huge[0]  # one line always stays, and stays whole


# --- hangs -----------------------------------------------------------------------------------------


def test_a_hang_is_a_timeout_and_the_worker_is_replaced():
    worker = CaseWorker(timeout_s=HANG_S)
    try:
        result = worker.run(CASE, "faulty_adapters:make_hang", 2)
        assert result.outcome is Outcome.TIMEOUT
        assert f"no result within {HANG_S:g} s" in result.error
        worker.timeout_s = GENEROUS_S  # the next case's own speed is not under test here
        assert worker.run(CASE, "torch", 2).outcome is Outcome.MISMATCH
        assert worker.restarts == 1
    finally:
        worker.close()


def _run_cli(impls: list[str], timeout_s: float, report: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "--device", "cpu", "--case", CASE.id,
         "--case-timeout", f"{timeout_s:g}", "--impl", ",".join(impls), "--report-dir", str(report), "-q"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _outcomes(proc: subprocess.Popen, report: Path) -> dict[str, dict]:
    """Wait for a command-line run; its records by impl (as given on the command line)."""
    out, err = proc.communicate(timeout=PROCESS_LIMIT_S)
    assert proc.returncode == 1, out + err  # the faults are unexpected failures
    return {r["impl"]: r for r in map(json.loads, (report / "results.jsonl").read_text().splitlines())}


def test_the_command_line_report_is_complete_after_faults(tmp_path):
    """Two runs side by side: the hang alone under a short limit, everything else under a long one."""
    hang = _run_cli(["faulty_adapters:make_hang"], HANG_S, tmp_path / "hang")
    rest = _run_cli(["bundled", "faulty_adapters:make_abort", "torch"], GENEROUS_S, tmp_path / "rest")
    try:
        records = {**_outcomes(rest, tmp_path / "rest"), **_outcomes(hang, tmp_path / "hang")}
    finally:
        for proc in (hang, rest):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert {k: v["outcome"] for k, v in records.items()} == {
        "bundled": "pass", "faulty_adapters:make_abort": "crash", "faulty_adapters:make_hang": "timeout",
        "torch": "mismatch"}
    assert records["torch"]["verdict"] == "xfail"


def test_a_worker_imports_the_code_under_test_before_its_first_case():
    # Which copy of a shared library a process keeps depends on who loads it first (seen on the
    # H200: TransformerEngine no longer imported in a worker whose first cases touched cuDNN), so
    # a worker asks the adapter for `unavailable()` (the import) as soon as it loads it.
    from harness.run.isolation import _load_code_under_test

    calls = []

    class Adapter:
        def unavailable(self):
            calls.append("imported")
            return None

    class Broken:
        def unavailable(self):
            raise RuntimeError("boom")  # the cases report it, not the worker's start

    _load_code_under_test(Adapter())
    _load_code_under_test(Broken())
    _load_code_under_test(object())  # an adapter without unavailable()
    assert calls == ["imported"]
