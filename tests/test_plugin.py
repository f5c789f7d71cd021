"""The pytest plugin, driven as a user would: a subprocess pytest over cases/ in the repo root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True)


def records(report_dir: Path) -> dict[tuple[str, str], dict]:
    lines = (report_dir / "results.jsonl").read_text().splitlines()
    return {(r["impl"], r["case_id"]): r for r in map(json.loads, lines)}


def test_unknown_impl_is_one_line_and_exit_2():
    proc = pytest_run("--impl", "nope")
    assert proc.returncode == 2
    assert "error: unknown implementation 'nope'" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


def test_known_failures_are_strict_xfails_and_reach_the_report(tmp_path):
    proc = pytest_run("--impl", "torch,bundled", "--device", "cpu", "-k", "flat-none", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "14 passed, 100 deselected, 6 xfailed" in proc.stdout
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
