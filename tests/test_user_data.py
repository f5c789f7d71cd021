"""Nothing a user has is lost (issue 43): a folder that holds a report is never overwritten
silently, a write that fails is one line and exit 2 with what was judged kept and reported, and
input that is not what the user meant gets one clear line instead of a run."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import report as reporting
from harness.fronts.cli import main
from harness.report import live as live_module
from harness.report.live import LiveResults
from harness.results import CaseRecord

ROOT = Path(__file__).resolve().parent.parent
PROCESS_LIMIT_S = 300  # a whole subprocess run, however loaded the machine; never a speed test
CASE = "nonreentrant-tracked-eager-flat-none-cpu"
CASES = [CASE, "reentrant-default-eager-flat-none-cpu", "nonreentrant-default-eager-flat-draws-cpu"]
needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command printed on stderr (asserting it is one, with no traceback)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def old_report(folder: Path) -> dict[str, bytes]:
    """A folder holding a report (every report file, each saying OLD): its bytes by name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in reporting.REPORT_FILES:
        (folder / name).write_text(f"OLD {name}\n")
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def results(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def record(case_id: str = CASE) -> CaseRecord:
    return CaseRecord.from_json({"impl": "bundled", "case_id": case_id, "outcome": "pass", "verdict": "pass"})


# -- a folder that already holds a report ------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["run", "--case", CASE, "--no-isolate"],
    ["fuzz", "--device", "cpu", "--examples", "1", "--no-isolate", "--no-database"],
    ["module", "examples.mlp:factory", "--device", "cpu"],
], ids=["run", "fuzz", "module"])
def test_a_folder_holding_a_report_is_refused_and_left_as_it_was(tmp_path, capsys, command):
    before = old_report(tmp_path / "rep")
    assert main([*command, "--report-dir", str(tmp_path / "rep")]) == 2
    line = one_error_line(capsys)
    assert f"report directory {tmp_path / 'rep'} already holds a report (summary.md, report.html" in line
    assert "--replace-report" in line
    assert snapshot(tmp_path / "rep") == before


def test_replace_report_replaces_the_old_report_whole(tmp_path, capsys):
    old_report(tmp_path / "rep")
    status = main(["run", "--case", CASE, "--no-isolate", "-q", "--report-dir", str(tmp_path / "rep"),
                   "--replace-report"])
    assert status == 0, capsys.readouterr().err
    assert [r["case_id"] for r in results(tmp_path / "rep")] == [CASE]
    assert set(snapshot(tmp_path / "rep")) == set(reporting.REPORT_FILES)
    assert not any(b"OLD" in text for text in snapshot(tmp_path / "rep").values())
    assert "**1 cases**" in (tmp_path / "rep" / "summary.md").read_text()


def test_a_replacing_run_removes_the_old_report_at_its_first_record_not_before(tmp_path):
    before = old_report(tmp_path / "rep")
    live = LiveResults(tmp_path / "rep", replace=True)
    live.close()  # stopped before any case finished: the old report stays whole
    assert snapshot(tmp_path / "rep") == before
    live = LiveResults(tmp_path / "rep", replace=True)
    live.append(record())
    live.close()
    assert list(snapshot(tmp_path / "rep")) == ["results.jsonl"]  # never old views beside new results
    assert [r["case_id"] for r in results(tmp_path / "rep")] == [CASE]


def test_a_folder_without_a_report_is_used_as_it_is(tmp_path):
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "notes.txt").write_text("mine")
    reporting.check_report_dir(tmp_path / "rep")  # no report file there: nothing to refuse
    assert reporting.report_files_in(tmp_path / "rep") == []


def test_pytest_refuses_a_report_dir_holding_a_report_unless_told_to_replace_it(tmp_path):
    before = old_report(tmp_path / "rep")
    proc = pytest_run("cases", "-q", "--device", "cpu", "-k", CASE, "--report-dir", str(tmp_path / "rep"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "already holds a report" in proc.stdout + proc.stderr
    assert snapshot(tmp_path / "rep") == before
    proc = pytest_run("cases", "-q", "--device", "cpu", "-k", f"bundled-{CASE}", "--report-dir",
                      str(tmp_path / "rep"), "--replace-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["case_id"] for r in results(tmp_path / "rep")] == [CASE]


# -- writes that fail ----------------------------------------------------------------------------


class FullDisk:
    """`os` for harness.report.live whose `write` takes `whole` writes, then half of the next one's
    bytes, then refuses with ENOSPC, as a filling disk does."""

    def __init__(self, whole: int) -> None:
        self.whole = whole

    def __getattr__(self, name: str):
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if self.whole > 0:
            self.whole -= 1
            return os.write(fd, data)
        if self.whole == 0:
            self.whole = -1
            return os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_append_names_the_file_and_leaves_whole_records_only(tmp_path, monkeypatch):
    monkeypatch.setattr(live_module, "os", FullDisk(whole=2))
    live = LiveResults(tmp_path)
    live.append(record(CASES[0]))
    live.append(record(CASES[1]))
    with pytest.raises(reporting.ReportWriteError) as raised:
        live.append(record(CASES[2]))
    assert str(raised.value) == (f"cannot write {tmp_path / 'results.jsonl'}: No space left on device "
                                 "(it keeps the 2 records written before)")
    assert [r["case_id"] for r in results(tmp_path)] == CASES[:2]  # no partial line


def test_a_full_disk_during_run_is_one_line_exit_2_and_the_judged_cases_are_reported_elsewhere(
        tmp_path, capsys, monkeypatch):
    target = tmp_path / "rep"
    monkeypatch.setattr(live_module, "os", FullDisk(whole=2))
    commit = reporting._commit

    def full(report_dir: Path, files: dict[str, str]) -> None:
        if Path(report_dir) == target:
            raise reporting.ReportWriteError(f"cannot write the report into {target} (summary.md): "
                                             "No space left on device; no file there was replaced")
        commit(report_dir, files)

    monkeypatch.setattr(reporting, "_commit", full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the fallback folder is made
    args = ["run", "--no-isolate", "-q", "--report-dir", str(target)]
    status = main([*args, *(a for case_id in CASES for a in ("--case", case_id))])
    err = capsys.readouterr().err
    assert status == 2
    lines = err.splitlines()
    assert lines[0] == (f"error: cannot write {target / 'results.jsonl'}: No space left on device (it keeps the "
                        "2 records written before); stopped after 3 of 3 cases")
    assert "Traceback" not in err and len(lines) == 2
    assert lines[1].startswith(f"error: cannot write the report into {target} (summary.md): No space left on "
                               "device; no file there was replaced; the report of the 3 records judged is in ")
    fallback = Path(re.search(r"is in (\S+) instead", lines[1]).group(1))
    assert fallback.parent == tmp_path and fallback.name.startswith("harness-report-")
    kept = results(fallback)
    assert sorted(r["case_id"] for r in kept) == sorted(CASES)  # everything judged, the unwritten one too
    assert all(r["interrupted"].startswith("stopped (cannot write") for r in kept)
    assert [r["case_id"] for r in results(target)] == CASES[:2]


def full_results_file(folder: Path) -> Path:
    """A report folder whose results.jsonl is /dev/full: every write to it fails with ENOSPC."""
    folder.mkdir()
    (folder / "results.jsonl").symlink_to("/dev/full")
    return folder


@needs_dev_full
def test_a_full_disk_during_fuzz_stops_it_with_exit_2_and_counts_the_program_it_could_not_write(tmp_path, capsys):
    folder = full_results_file(tmp_path / "rep")
    status = main(["fuzz", "--device", "cpu", "--examples", "3", "--no-isolate", "--no-database", "--seed", "1",
                   "--report-dir", str(folder)])
    out, err = capsys.readouterr()
    assert status == 2
    assert err.strip() == (f"error: cannot write {folder / 'results.jsonl'}: No space left on device (it keeps the 0 "
                           "records written before); stopped after 1 programs")
    assert "no failure in 1 programs" in out
    [kept] = results(folder)  # the final report replaced the file: the judged program is in it
    assert kept["interrupted"].startswith("stopped (cannot write")


@needs_dev_full
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_full_disk_under_pytest_stops_the_session_with_exit_2_and_a_marked_report(tmp_path, workers):
    folder = full_results_file(tmp_path / "rep")
    proc = pytest_run("cases", "-q", "-k", "bundled and flat", "--report-dir", str(folder), *workers)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"stopped (cannot write {folder / 'results.jsonl'}: No space left on device" in proc.stdout
    [kept] = results(folder)
    assert kept["interrupted"].startswith("stopped (cannot write")


@needs_dev_full
@pytest.mark.parametrize("command, what", [
    (["repro", CASE, "--script", "/dev/full"], "--script"),
    (["module", "examples.mlp:factory", "--device", "cpu", "--script", "/dev/full"], "--script"),
    (["bench", "--device", "cpu", "--cases", "2", "--json", "/dev/full"], "--json"),
], ids=["repro", "module", "bench"])
def test_an_output_file_that_cannot_be_written_is_one_line_and_exit_2(capsys, command, what):
    assert main(command) == 2
    assert one_error_line(capsys) == f"error: cannot write {what} /dev/full: No space left on device\n"


# -- input that is not what the user meant ---------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["run", "--impl", "", "--case", CASE], "error: --impl '' names no implementation"),
    (["run", "--case", CASES[1], "--layout", "tracked"], "error: --case names whole cases: leave out --layout"),
    (["run", "--case", CASE, "--matrix", "full"], "error: --case names whole cases: leave out --matrix"),
    (["run", "--case", CASE, "--case", CASE], f"error: --case {CASE} is given twice"),
    (["run", "--case", CASE, "--device", "cuda"], f"error: --case {CASE} runs on cpu, which --device cuda leaves out"),
    (["run", "--program", "nope"], "error: unknown program 'nope': a program is a nesting (flat, nested"),
    (["list", "--program", "nope"], "or a spec (e.g. '(native_dropout+rand)')"),
    (["list", "--device", "cpu", "--op", "sdpa_flash"], "error: no case matches --device cpu --op sdpa_flash"),
    (["expectations", "explain", CASE, "--impl", "nope"], "error: --impl 'nope' is no known implementation"),
    (["expectations", "explain", CASE, "--impl", "torch", "--version", "notaversion"],
     "error: --version 'notaversion' is not a PEP 440 version"),
], ids=["empty-impl", "case-and-layout", "case-and-matrix", "case-twice", "case-and-other-device", "run-program",
        "list-program", "list-nothing", "explain-impl", "explain-version"])
def test_input_that_is_not_what_the_user_meant_is_one_line_and_exit_2(capsys, args, message):
    assert main(args) == 2
    assert message in one_error_line(capsys)


def test_a_case_id_with_its_own_device_named_again_runs(tmp_path, capsys):
    status = main(["run", "--case", CASE, "--device", "cpu", "--no-isolate", "-q", "--report-dir", str(tmp_path / "r")])
    assert status == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [["run", "--case", CASE], ["repro", CASE],
                                     ["fuzz", "--device", "cpu", "--examples", "1"]], ids=["run", "repro", "fuzz"])
def test_an_expectation_entry_for_an_unknown_impl_is_one_line_and_exit_2(tmp_path, capsys, command):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nname = "typo"\nimpl = "trch"\nmode = "reentrant"\nreason = "r"\n')
    assert main([*command, "--expectations", str(path)]) == 2
    assert one_error_line(capsys) == (
        f"error: expectations file {path}: entry 1 (typo) names impl 'trch', which matches no known implementation; "
        "the names: python -m harness list --impls (an import path pkg.mod:factory also counts)\n")


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=PROCESS_LIMIT_S)


@pytest.mark.parametrize("args", [["-n", "auto", "--workers-per-gpu", "0"], ["--workers-per-gpu", "0"]],
                         ids=["with-n-auto", "without-n"])
def test_pytest_refuses_zero_workers_per_gpu_in_one_line(args):
    proc = pytest_run("cases", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == "error: --workers-per-gpu must be at least 1, got 0\n"


def test_pytest_names_what_program_takes(tmp_path):
    proc = pytest_run("cases", "--program", "nope")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown program 'nope': a program is a nesting" in proc.stdout + proc.stderr


def test_a_corpus_write_that_fails_leaves_the_corpus_whole(tmp_path):
    # A real failed write: the process may not grow any file past a few bytes more than the corpus
    # holds (RLIMIT_FSIZE, as a full disk refuses).  Writing the corpus in place would have cut it
    # off at that point; the corpus must come out as it went in, with no temporary file left.
    from harness.model import corpus
    from harness.model.cases import parse_case_id

    path = tmp_path / "corpus.toml"
    assert corpus.append(parse_case_id(CASE), "torch", "mismatch: gradient", path)
    before = path.read_bytes()
    limit = len(before) + 16
    code = (f"import resource, signal\n"
            f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
            f"from harness.model import corpus\n"
            f"from harness.model.cases import parse_case_id\n"
            f"corpus.append(parse_case_id({CASES[1]!r}), 'torch', 'mismatch: gradient', {str(path)!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=PROCESS_LIMIT_S)
    assert proc.returncode != 0 and "File too large" in proc.stderr, proc.stderr
    assert path.read_bytes() == before  # never cut off: the finding before it is still there
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.toml"]  # no temporary file left behind


def test_ctrl_c_while_a_run_sets_up_leaves_the_old_report_whole_without_a_traceback(tmp_path):
    # Ctrl-C right after the first line (workers about to start, no case judged): exit 130, no
    # traceback, and the report that --replace-report would have replaced is still whole.
    import signal

    before = old_report(tmp_path / "rep")
    # SIGINT as at a terminal: a suite started in the background of a non-interactive shell has it
    # ignored, and a child inherits that (Python then installs no handler until the run's loop)
    run = subprocess.Popen([sys.executable, "-m", "harness", "run", "--case", CASE, "--report-dir",
                            str(tmp_path / "rep"), "--replace-report"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert run.stdout.readline().startswith("case workers: ")  # printed before any case runs
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=PROCESS_LIMIT_S)
    finally:
        run.kill()
    assert run.returncode == 130, out + err
    assert "Traceback" not in err and "interrupted" in err, err
    assert snapshot(tmp_path / "rep") == before
