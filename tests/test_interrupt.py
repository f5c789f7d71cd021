"""Ctrl-C: the command line and pytest both stop with status 130 and write the report of the cases that
finished, marked "interrupted after k of n cases" in every file.

Each run is a bundled case, which passes, then a case of an adapter that hangs (under a case limit of
600 s, which it never reaches).  The SIGINT is sent once the output shows the bundled case finished
and the hanging case started: the tests synchronise on output, never on sleeps or speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE = "reentrant-default-eager-flat-none-cpu"
HANG = "faulty_adapters:make_hang"
PROCESS_LIMIT_S = 300  # waiting for output, or for the exit after Ctrl-C, however loaded the machine
ENV = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
    p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p))  # faulty_adapters importable


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default.  A job that a non-interactive shell
    starts in the background (as a CI runner may run this suite) inherits SIGINT ignored, and a
    Python started with SIGINT ignored never raises KeyboardInterrupt: Ctrl-C could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Watched:
    """A subprocess (in a process group of its own, so that whatever it leaves behind can be killed)
    whose stdout is read as it comes; stderr goes to a file."""

    def __init__(self, argv: list[str], stderr: Path) -> None:
        self._stderr_path = stderr
        with open(stderr, "w") as err:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=err,
                                         start_new_session=True, preexec_fn=_default_sigint)
        self._chunks: list[bytes] = []
        self._lock = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 1 << 16):
            with self._lock:
                self._chunks.append(chunk)
                self._lock.notify_all()
        with self._lock:
            self._eof = True
            self._lock.notify_all()

    @property
    def stdout(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self._stderr_path.read_text()

    def wait_for(self, pattern: str) -> None:
        """Block until stdout matches `pattern` (a regular expression, multiline)."""
        found = lambda: self._eof or re.search(pattern, self.stdout, re.M) is not None  # noqa: E731
        with self._lock:
            self._lock.wait_for(found, timeout=PROCESS_LIMIT_S)
        assert re.search(pattern, self.stdout, re.M), \
            f"no {pattern!r} in the output:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"

    def interrupt(self, sig: int = signal.SIGINT) -> int:
        """`sig` to the process itself (not its group, as a terminal would); its exit status."""
        self.proc.send_signal(sig)
        status = self.proc.wait(timeout=PROCESS_LIMIT_S)
        self._reader.join(timeout=PROCESS_LIMIT_S)
        return status

    def kill(self) -> None:
        """Kill the process and anything it left in its group (an isolated case worker)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=PROCESS_LIMIT_S)
        self.proc.stdout.close()


def report_records(report_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]


def _cli_stopped(tmp_path: Path, sig: int = signal.SIGINT) -> tuple[Watched, int]:
    """The command line run, stopped by `sig` once the bundled case passed; the finished case
    must already be in results.jsonl then (appended the moment it was judged)."""
    run = Watched([sys.executable, "-m", "harness", "run", "--device", "cpu", "--case", CASE,
                   "--impl", f"bundled,{HANG}", "--case-timeout", "600", "--report-dir", str(tmp_path / "r")],
                  tmp_path / "stderr.txt")
    try:
        # Printed after the bundled record is kept; the hanging case is next, and nothing else is.
        run.wait_for(rf"^\[1/2\] pass\s+pass\s+bundled {CASE}$")
        [on_disk] = report_records(tmp_path / "r")
        assert (on_disk["impl"], on_disk["case_id"], on_disk["verdict"]) == ("bundled", CASE, "pass")
        status = run.interrupt(sig)
    finally:
        run.kill()
    return run, status


def test_ctrl_c_stops_the_command_line_with_130_and_a_report_of_the_finished_cases(tmp_path):
    run, status = _cli_stopped(tmp_path)
    assert status == 130, run.stdout + run.stderr
    message = "interrupted after 1 of 2 cases"
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    [record] = report_records(tmp_path / "r")
    assert (record["impl"], record["case_id"], record["verdict"]) == ("bundled", CASE, "pass")
    assert record["interrupted"] == message
    for name in ("summary.md", "report.html"):
        assert message in (tmp_path / "r" / name).read_text(), name


def _pytest_interrupted(tmp_path: Path, sig: int = signal.SIGINT) -> tuple[Watched, int]:
    """The pytest run, stopped by `sig` once the bundled case passed and the hanging case started;
    the controller must already have the finished case in results.jsonl then."""
    # `-k reentrant-default-eager-flat-none` alone would select the nonreentrant cases too.
    keyword = f"bundled-{CASE} or make_hang-{CASE}"
    run = Watched([sys.executable, "-m", "pytest", "cases", "-p", "no:cacheprovider", "-p", "no:xdist",
                   "--impl", f"bundled,{HANG}", "--device", "cpu", "--isolate", "--case-timeout", "600", "-k", keyword,
                   "--report-dir", str(tmp_path / "r"), "-v"], tmp_path / "stderr.txt")
    try:
        run.wait_for(rf"test_case\[bundled-{CASE}\] PASSED")
        run.wait_for(rf"test_case\[{HANG}-{CASE}\]")  # the next test started: the bundled one is all done
        [on_disk] = report_records(tmp_path / "r")
        assert on_disk["case_id"] == CASE
        status = run.interrupt(sig)
    finally:
        run.kill()
    return run, status


def test_ctrl_c_stops_pytest_with_130_and_a_report_of_the_finished_cases(tmp_path):
    run, status = _pytest_interrupted(tmp_path)
    output = run.stdout + run.stderr
    assert status == 130, output[-3000:]
    assert "INTERNALERROR" not in output
    assert re.search(r"\b2 selected\b", run.stdout), run.stdout[-3000:]
    [record] = report_records(tmp_path / "r")
    assert (record["impl"], record["case_id"], record["verdict"]) == ("bundled", CASE, "pass")
    match = re.fullmatch(r"interrupted after 1 of (\d+) cases", record["interrupted"])
    assert match, record["interrupted"]
    message = record["interrupted"]
    assert f"harness report: {tmp_path / 'r'} (1 cases, {message})" in run.stdout
    for name in ("summary.md", "report.html"):
        assert message in (tmp_path / "r" / name).read_text(), name
    assert int(match.group(1)) == 2, message  # the cases selected, after -k / -m deselection


def test_sigterm_stops_the_command_line_with_143_and_the_finished_cases_are_on_disk_before_it(tmp_path):
    # A CI job at its time limit gets SIGTERM.  The finished case is in results.jsonl while the run
    # still goes on (a SIGKILL later would lose nothing: `_cli_stopped` checks), and SIGTERM writes
    # the marked report.
    run, status = _cli_stopped(tmp_path, signal.SIGTERM)
    assert status == 143, run.stdout + run.stderr
    message = "terminated (SIGTERM) after 1 of 2 cases"
    assert message in run.stderr and "Traceback" not in run.stderr
    [record] = report_records(tmp_path / "r")
    assert record["interrupted"] == message
    assert message in (tmp_path / "r" / "summary.md").read_text()


def test_sigterm_stops_pytest_with_143_and_a_marked_report(tmp_path):
    run, status = _pytest_interrupted(tmp_path, signal.SIGTERM)
    assert status == 143, run.stdout[-3000:] + run.stderr[-3000:]
    [record] = report_records(tmp_path / "r")
    assert record["interrupted"] == "terminated (SIGTERM) after 1 of 2 cases"


def test_ctrl_c_stops_the_fuzzer_even_when_the_case_swallows_it_and_keeps_what_ran(tmp_path):
    # Code under test (an impl, autograd, Hypothesis) may catch the KeyboardInterrupt and go on:
    # the fuzzer must stop anyway, exit 130, and keep every program judged before the signal.
    run = Watched([sys.executable, "-m", "harness", "fuzz", "--impl", "faulty_adapters:make_swallow_ctrl_c",
                   "--device", "cpu", "--no-isolate", "--no-database", "--seed", "3", "--budget", "600",
                   "--report-dir", str(tmp_path / "r")], tmp_path / "stderr.txt")
    try:
        run.wait_for(r"^faulty adapter: waiting for Ctrl-C")
        judged = report_records(tmp_path / "r")  # one line per program run (a case may run twice)
        assert judged, "no program's record was on disk before the signal"
        before = {r["case_id"] for r in judged}
        status = run.interrupt()
    finally:
        run.kill()
    assert status == 130, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    records = report_records(tmp_path / "r")
    assert {r["case_id"] for r in records} == before  # the interrupted program is not counted
    message = f"interrupted after {len(judged)} programs"
    assert message in run.stderr and all(r["interrupted"] == message for r in records)
    assert message in (tmp_path / "r" / "summary.md").read_text()
