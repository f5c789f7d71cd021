"""Fault isolation: a faulty adapter that raises, hangs, aborts or segfaults is recorded, and the
run goes on (cases run in a replaceable worker process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cases import parse_case_id
from harness.isolation import CaseWorker
from harness.runner import Outcome

ROOT = Path(__file__).resolve().parent.parent
CASE = parse_case_id("reentrant-tracked-eager-flat-none-cpu")


@pytest.fixture(scope="module")
def worker():
    w = CaseWorker(timeout_s=3)
    yield w
    w.close()


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


def test_a_hang_is_a_timeout_and_the_worker_is_replaced():
    worker = CaseWorker(timeout_s=3)
    try:
        result = worker.run(CASE, "faulty_adapters:make_hang", 2)
        assert result.outcome is Outcome.TIMEOUT
        assert "no result within 3 s" in result.error
        worker.timeout_s = 300  # the next case's own speed is not under test here
        assert worker.run(CASE, "torch", 2).outcome is Outcome.MISMATCH
        assert worker.restarts == 1
    finally:
        worker.close()


def test_the_command_line_report_is_complete_after_faults(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--device", "cpu", "--case", CASE.id, "--case-timeout", "10",
         "--impl", "bundled,faulty_adapters:make_abort,faulty_adapters:make_hang,torch",
         "--report-dir", str(tmp_path), "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # the faults are unexpected failures
    records = {r["impl"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert {k: v["outcome"] for k, v in records.items()} == {
        "bundled": "pass", "faulty-abort": "crash", "faulty-hang": "timeout", "torch": "mismatch"}
    assert records["torch"]["verdict"] == "xfail"
