"""What a `--ranks N` run may start and what it leaves (issue 59): N bounded by what the machine
holds, no rank outliving the run whatever kills it (SIGKILL of the harness or of the launcher),
no launcher folder left in the temporary folder, a stop that does not wait for the ranks, the
options that do not apply refused before anything is made, and the facts a model needs carried
from the ranks to the judge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import rank_context
from harness.rank_context import max_ranks, options_problem

ROOT = Path(__file__).resolve().parent.parent
CASE = "nonreentrant-default-eager-flat-none-cpu"
LIMIT_S = 300  # a whole CLI run or a wait for processes to go, however loaded the machine; never a speed test


def harness(*args: str, env: "dict[str, str] | None" = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=LIMIT_S, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_bound_comes_from_the_cores_or_the_memory_whichever_holds_fewer(monkeypatch):
    assert max_ranks(cores=2, memory=24 << 30) == (8, "4 per core on 2 cores")
    bound, why = max_ranks(cores=64, memory=10 << 30)
    assert bound == 10 and why == "1 GiB a rank of the 10.0 GiB of memory available"
    assert max_ranks(cores=1, memory=0)[0] == 2  # two ranks is what --ranks means at least
    monkeypatch.setattr(rank_context, "available_memory_bytes", lambda: None)
    assert max_ranks(cores=16) == (64, "4 per core on 16 cores")  # no /proc/meminfo: the cores alone


def test_more_ranks_than_the_machine_holds_is_one_line_and_starts_nothing(tmp_path):
    bound, _ = max_ranks()
    assert options_problem(bound) is None and f"holds at most {bound} ranks" in options_problem(bound + 1)
    proc = harness("run", "--impl", "bundled", "--ranks", "100000", "--case", CASE, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: --ranks 100000: this machine holds at most {bound} ranks at once (")
    assert list(tmp_path.iterdir()) == []  # refused before a report folder was made


@pytest.mark.parametrize(("extra", "message"), [
    (["--jobs", "2"], "error: --ranks runs every case in one group of rank processes: leave out --jobs and "
                      "--workers-per-gpu"),
    (["--no-isolate"], "error: --ranks runs every case in rank processes of its own: leave out --no-isolate"),
])
def test_options_that_do_not_apply_to_ranks_are_refused_before_a_report_folder_is_made(tmp_path, extra, message):
    proc = harness("run", "--impl", "bundled", "--ranks", "2", "--case", CASE, *extra, cwd=tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, message)
    assert list(tmp_path.iterdir()) == []


def _ranks_below(folder: Path) -> list[int]:
    """Pids of the rank processes (launcher and ranks) whose command line names a launch folder
    under `folder` (the harness makes it in its TMPDIR)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.run.rank_entry" in words and any(str(folder).encode() in w for w in words):
            found.append(int(cmdline.parent.name))
    return found


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_no_rank_outlives_its_launcher_or_the_harness_whatever_kills_them(tmp_path):
    report = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    run = subprocess.Popen([sys.executable, "-m", "harness", "run", "--impl", "bundled,torch", "--ranks", "2",
                            "--device", "cpu", "--report-dir", str(report), "-q"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(_ranks_below(tmp_path)) == 3, "the launcher and its two ranks never ran")
        launcher = [pid for pid in _ranks_below(tmp_path)
                    if b"launch" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        first = set(_ranks_below(tmp_path))
        os.kill(launcher[0], signal.SIGKILL)  # its ranks die with it; the harness starts a new launch
        _wait_for(lambda: not first & set(_ranks_below(tmp_path)), "a rank outlived its launcher")
        _wait_for(lambda: len(_ranks_below(tmp_path)) == 3, "no new launch took over the cases")
        run.kill()  # SIGKILL: no handler of the harness runs; the launcher and its ranks die with it
        run.wait(LIMIT_S)
        _wait_for(lambda: not _ranks_below(tmp_path), "a rank process outlived the SIGKILLed harness")
    finally:
        if run.poll() is None:
            run.kill()


def test_a_ranks_run_leaves_nothing_in_the_temporary_folder_and_says_it_used_ranks(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    proc = harness("run", "--impl", "bundled", "--ranks", "2", "--case", CASE, "--report-dir",
                   str(tmp_path / "report"), env={"TMPDIR": str(temporary)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "ranks: every case in 2 rank processes (tp2), one launch per impl (--ranks)"
    assert list(temporary.iterdir()) == []  # torchelastic_* folders of the launcher included


@pytest.mark.skipif(not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
                    reason="this torch has no regional budget: torch-region-budget cannot run")
def test_a_model_entry_that_needs_what_the_ranks_observed_judges_their_record(tmp_path):
    # torch-region-budget's known bug is a model over what its compiled region kept: a record of
    # two ranks must carry that observed fact, or the known bug becomes an unexpected failure
    proc = harness("run", "--impl", "torch-region-budget", "--ranks", "2", "--case", CASE, "--report-dir",
                   str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [record] = [json.loads(line) for line in (tmp_path / "report" / "results.jsonl").read_text().splitlines()]
    assert (record["ranks"], record["verdict"], record["outcome"]) == (2, "xfail", "mismatch")
    assert record["machine_facts"]


class _Launch:
    def __init__(self) -> None:
        self.closed_with: "bool | None" = None

    def close(self, kill: bool) -> None:
        self.closed_with = kill


@pytest.mark.parametrize(("stop", "killed"), [(None, False), (KeyboardInterrupt, True), (GeneratorExit, True)])
def test_a_stopped_group_kills_its_ranks_and_a_finished_one_lets_them_finish(stop, killed):
    """Ctrl-C (or a consumer that let go of `run_ranked`) must not wait for the ranks' current
    case (up to `STOP_WAIT_S`); a group that ends normally asks them to stop."""
    from harness.run.ranks import RankGroup

    group, launch = RankGroup(2, 60.0), _Launch()
    group._launch = launch
    try:
        with group:
            if stop is not None:
                raise stop
    except (KeyboardInterrupt, GeneratorExit):
        pass
    assert launch.closed_with is killed
