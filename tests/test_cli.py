"""The command line: exit statuses, one-line errors, and what `run` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--impl", "nope", "--device", "cpu"], "unknown implementation 'nope'; known: bundled"),
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
    assert main(["list", "--device", "cpu", "--layout", "shared", "--nesting", "flat"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == [
        "reentrant-shared-eager-flat-none-cpu", "reentrant-shared-eager-flat-draws-cpu",
        "nonreentrant-shared-eager-flat-none-cpu", "nonreentrant-shared-eager-flat-draws-cpu",
    ]


def test_run_writes_the_stable_schema_and_exits_0_when_failures_are_expected(tmp_path, capsys):
    status = main(["run", "--impl", "bundled,torch", "--device", "cpu", "--layout", "tracked",
                   "--nesting", "flat", "--report-dir", str(tmp_path), "-q"])
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
