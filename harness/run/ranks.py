"""`--ranks N` (issue 41): each case runs in N processes that form one parallel layout (TP x CP
x DP, `rank_context`), started through torch.distributed's own launcher, and its verdict is all
ranks'.

A `RankGroup` keeps one launch (``python -m torch.distributed.run --standalone --nproc-per-node
N -m harness.run.rank_worker``) running between cases: starting N processes that import torch
costs seconds, so the ranks follow a queue file the group appends cases to (`rank_worker`), and
the group reads what they append as they go (only the new bytes of each file per poll).
`run_ranked` queues a whole list at once (the matrix); the fuzzer queues one program at a time
through `RankGroup.run`, the interface of an isolated case worker.  A case's result combines its
ranks (`combine`): every rank's own oracles (each rank's checkpointed run against its own
reference, mismatches marked with the rank) plus the cross-rank oracle ``rank-streams``.  A
launch that dies is that case's crash, one that stops making progress for the case time limit
its timeout: the launcher and every rank below it are killed (no rank is left running) and a new
launch takes the cases queued after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..model.cases import Case
from ..rank_context import RankContext, layout_problem
from ..results import Mismatch, Outcome
from . import rank_entry
from .runner import CaseResult, result_from_dict

# How often the group looks at the ranks' files: at once after something came (the fuzzer waits on
# every case), then less often the longer nothing does (the ranks share the machine's cores).
POLL_MIN_S, POLL_MAX_S = 0.001, 0.02
# The launcher's start (N processes importing torch, joining the group) is not the first case's
# time: until a rank starts a case the limit is this, or the case limit where that is longer.
STARTUP_S = 120.0
# torch.distributed's launcher through `rank_entry`, which ties it (and each rank) to its parent.
LAUNCHER = ("-m", "harness.run.rank_entry", "launch", "--standalone", "--max-restarts=0")
STOP_WAIT_S = 30.0  # how long ranks asked to stop may take before they are killed


class _RankFile:
    """One rank's output file, read incrementally: kept open once it exists, each read takes only
    the bytes added since the last."""

    def __init__(self, path: Path) -> None:
        self.path, self.partial = path, b""
        self.source: Any = None

    def new_lines(self) -> list[dict[str, Any]]:
        if self.source is None:
            try:
                self.source = open(self.path, "rb")
            except FileNotFoundError:
                return []
        data = self.source.read()
        *whole, self.partial = (self.partial + data).split(b"\n")  # the last piece: a line being written
        return [json.loads(line) for line in whole if line.strip()]

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def combine(case: Case, impl: str, lines: Sequence[dict[str, Any]], layout: str = "") -> CaseResult:
    """One case's result from its ranks' lines (rank order): an error or an unsupported answer of
    any rank is the case's (naming the ranks after the message); else its mismatches are every rank's own (subject
    marked ``@rank R``) and the cross-rank ones; the reference breaking the rank layout is the
    harness's setup failing, an error."""
    per = [result_from_dict(line["result"]) for line in lines]
    first = per[0]
    result = CaseResult(case, impl, Outcome.PASS, impl_version=first.impl_version, iterations=first.iterations,
                        ranks=len(per), rank_layout=layout, duration_s=max(r.duration_s for r in per))
    # What the ranks saw their torch do (what a compiled region's partition kept, say): the facts an
    # entry's model asks.  Each rank runs the same program, so the first rank that says a fact says it.
    for rank_result in per:
        result.observed = {**rank_result.observed, **result.observed}
    result.per_rank = [{"rank": n, "outcome": r.outcome.value, "oracles": sorted({m.oracle for m in r.mismatches}),
                        **({"error": r.error} if r.error else {}), **({"reason": r.reason} if r.reason else {})}
                       for n, r in enumerate(per)]
    for outcome in (Outcome.ERROR, Outcome.UNSUPPORTED, Outcome.SKIPPED):
        hit = [(n, r) for n, r in enumerate(per) if r.outcome is outcome]
        if hit:
            n, r = hit[0]
            result.outcome = outcome
            result.reason, result.traceback = r.reason, r.traceback
            # which ranks, after the message: an entry's message matches from its start
            alike = [m for m, other in enumerate(per) if other.outcome is outcome and other.error == r.error]
            where = "every rank" if len(alike) == len(per) else f"rank {', '.join(map(str, alike))}"
            result.error = f"{r.error} [{where}]" if r.error else ""
            return result
    crossed = [Mismatch.from_dict(m) for m in lines[0].get("cross_reference", [])]
    if crossed:
        result.outcome = Outcome.ERROR
        result.error = ("RankLayoutError: the reference itself breaks the tensor-parallel stream layout "
                        f"(the harness's setup, not the impl): {crossed[0].message()}")
        return result
    for n, r in enumerate(per):
        result.mismatches += [Mismatch(m.oracle, f"{m.subject}@rank{n}", m.iteration, m.count, m.total,
                                       m.first_index, m.got, m.expected, m.detail) for m in r.mismatches]
    result.mismatches += [Mismatch.from_dict(m) for m in lines[0].get("cross", [])]
    result.outcome = Outcome.MISMATCH if result.mismatches else Outcome.PASS
    return result


def _failed(case: Case, impl: str, layout: RankContext, outcome: Outcome, error: str,
            exits: "dict[int, int] | None" = None) -> CaseResult:
    """A case no rank finished; `exits`: each rank's exit code where the launcher reported it (a
    rank the launcher stopped after another died shows SIGTERM: -15)."""
    result = CaseResult(case, impl, outcome, error=error, ranks=layout.world, rank_layout=layout.label())
    result.per_rank = []
    for n in range(layout.world):
        code = (exits or {}).get(n)
        entry: dict[str, Any] = {"rank": n, "outcome": outcome.value}
        if code is not None:
            entry.update(exit=code, outcome="stopped" if code == -signal.SIGTERM else outcome.value)
        result.per_rank.append(entry)
    return result


def _exits(log: Path) -> dict[int, int]:
    """Rank -> exit code, from the launcher's failure summary ("rank : 1 (local_rank: 1)" then
    "exitcode : 7")."""
    out: dict[int, int] = {}
    rank = None
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        words = line.replace(":", " ").split()
        if len(words) >= 2 and words[0] == "rank" and words[1].isdigit():
            rank = int(words[1])
        elif len(words) >= 2 and words[0] == "exitcode" and rank is not None:
            try:
                out[rank] = int(words[1])
            except ValueError:
                pass
            rank = None
    return out


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    picked = [line.strip() for line in text if line.strip() and ("rank" in line or "Error" in line
                                                                or "exitcode" in line or "Signal" in line)]
    return " | ".join((picked or text)[-lines:])


class _Launch:
    """One running launch: its folder and queue, the launcher process, what its ranks wrote."""

    def __init__(self, layout: RankContext) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="harness-ranks-")
        self.folder = Path(self._tmp.name)
        self.log = self.folder / "launcher.log"
        spec = self.folder / "spec.json"
        spec.write_text(json.dumps({"tp": layout.tp, "cp": layout.cp, "parent": os.getpid()}))
        self.queue = open(self.folder / "queue.jsonl", "a", buffering=1)
        # TMPDIR: the launcher's own torchelastic_* folders go into this launch's folder, removed with it
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TORCHELASTIC_ERROR_FILE": str(self.folder / "error.json"), "TMPDIR": str(self.folder),
               rank_entry.PARENT_ENV: str(os.getpid())}
        with open(self.log, "w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, *LAUNCHER, f"--nproc-per-node={layout.world}", "-m", "harness.run.rank_entry",
                 "rank", str(spec), str(self.folder)], stdout=sink, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        self.files = [_RankFile(self.folder / f"rank{rank}.jsonl") for rank in range(layout.world)]
        self.results: list[dict[int, dict[str, Any]]] = [{} for _ in range(layout.world)]
        self.started: set[int] = set()

    def send(self, order: dict[str, Any]) -> None:
        self.queue.write(json.dumps(order) + "\n")

    def read(self) -> bool:
        """Take in the lines the ranks added since the last read; whether there were any."""
        came = False
        for rank, file in enumerate(self.files):
            for data in file.new_lines():
                came = True
                self.started.add(data["index"])
                if "result" in data:
                    self.results[rank][data["index"]] = data
        return came

    def finished(self, index: int) -> bool:
        return all(index in per for per in self.results)

    def take(self, index: int) -> list[dict[str, Any]]:
        return [per.pop(index) for per in self.results]

    def close(self, kill: bool) -> None:
        """Stop the ranks (asked to with a stop line, or killed) and remove the folder."""
        try:
            if not kill and self.process.poll() is None:
                self.send({"stop": True})
                try:
                    self.process.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
            if self.process.poll() is None:
                _kill(self.process)
        finally:
            self.queue.close()
            for file in self.files:
                file.close()
            self._tmp.cleanup()


class RankGroup:
    """N ranks that stay running between cases, in one layout (`tp` x `cp` x DP; tp 0: all).

    `submit` queues a case, `next_result` answers the oldest queued case; `run` is both, with
    the interface of `isolation.CaseWorker`, so the fuzzer drives a group as it drives a worker.
    Never raises for a rank that dies or hangs: that case is a crash or a timeout, the launch is
    killed and the cases queued after it go to a new one.
    """

    def __init__(self, ranks: int, case_timeout: float, tp: int = 0, cp: int = 1) -> None:
        if ranks < 2:
            raise ValueError("a rank group needs at least two ranks")
        problem = layout_problem(ranks, tp, cp)
        if problem:
            raise ValueError(problem)
        self.case_timeout = case_timeout
        self.layout = RankContext(0, ranks, tp, cp)
        self.restarts = 0  # launches replaced after a crash or a timeout
        self._launch: _Launch | None = None
        self._queued: deque[tuple[Case, dict[str, Any]]] = deque()
        self._next_index = 0
        self._since = time.monotonic()  # the clock of the oldest queued case
        self._timing = -1  # the index whose own clock (since a rank started it) `_since` is

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # Stopped by an exception (Ctrl-C, SIGTERM, a consumer that let go of `run_ranked`): the
        # ranks' current case is of no use, so they are killed rather than let finish it.
        self.close(kill=exc_type is not None)

    def start(self) -> None:
        """Start the ranks now (they import torch: seconds), without waiting for them."""
        if self._launch is None:
            self._launch = _Launch(self.layout)
            self._since, self._timing = time.monotonic(), -1
            for _, order in self._queued:  # what a replaced launch left undone
                self._launch.send(order)

    def submit(self, case: Case, impl: str, iterations: "int | None" = None) -> None:
        """Queue `case` for `impl` (`iterations`: the program's where None)."""
        if not self._queued:
            self._since, self._timing = time.monotonic(), -1
        order = {"index": self._next_index, "case": case.id, "impl": impl, "iterations": iterations}
        self._next_index += 1
        self._queued.append((case, order))
        if self._launch is None:
            self.start()  # sends every queued order, this one included
        else:
            self._launch.send(order)

    def run(self, case: Case, impl: str, iterations: "int | None" = None) -> CaseResult:
        """Run `case` for `impl` on every rank and combine them (what `CaseWorker.run` promises)."""
        self.submit(case, impl, iterations)
        return self.next_result()

    def next_result(self) -> CaseResult:
        """The result of the oldest queued case, when every rank has it or the launch failed it."""
        if not self._queued:
            raise ValueError("no case is queued")
        case, order = self._queued[0]
        index, impl = order["index"], order["impl"]
        launch = self._launch
        assert launch is not None
        wait = POLL_MIN_S
        while True:
            wait = POLL_MIN_S if launch.read() else min(wait * 2, POLL_MAX_S)
            if launch.finished(index):
                self._queued.popleft()
                self._since, self._timing = time.monotonic(), -1
                return combine(case, impl, launch.take(index), self.layout.label())
            if self._timing != index and index in launch.started:
                self._since, self._timing = time.monotonic(), index  # its own time starts when a rank starts it
            code = launch.process.poll()
            if code is not None:
                launch.read()  # the ranks write before they exit: read once more before calling it a crash
                if launch.finished(index):
                    continue
                where = "while running it" if index in launch.started else "before it started"
                exits = _exits(launch.log)
                dead = [f"rank {n} (exit code {c})" for n, c in sorted(exits.items()) if c != -signal.SIGTERM]
                who = f"{', '.join(dead)} died" if dead else "a rank died"
                error = (f"{who} {where}; the launcher stopped the others (launcher exit {code}): "
                         f"{_tail(launch.log)}")
                return self._replace(_failed(case, impl, self.layout, Outcome.CRASH, error, exits))
            limit = self.case_timeout if self._timing == index else max(self.case_timeout, STARTUP_S)
            if time.monotonic() - self._since > limit:
                what = (f"not every rank finished the case within {self.case_timeout:g} s" if self._timing == index
                        else f"no rank started the case within {limit:g} s of the last")
                return self._replace(_failed(case, impl, self.layout, Outcome.TIMEOUT,
                                             f"{what}: every rank and the launcher were killed"))
            time.sleep(wait)

    def _replace(self, failed: CaseResult) -> CaseResult:
        """The oldest case failed its launch: kill the launch, start a new one for the rest."""
        self._queued.popleft()
        if self._launch is not None:
            self._launch.close(kill=True)
        self._launch = None
        self.restarts += 1
        if self._queued:
            self.start()
        return failed

    def close(self, kill: bool = False) -> None:
        """Stop the ranks (idempotent): asked to, once they finish their case, or with `kill` at
        once (a run that was stopped); cases still queued are dropped."""
        self._queued.clear()
        if self._launch is not None:
            launch, self._launch = self._launch, None
            launch.close(kill=kill)


def run_ranked(impl: str, cases: Sequence[Case], ranks: int, case_timeout: float,
               iterations: "int | None" = None, tp: int = 0, cp: int = 1) -> Iterator[tuple[int, CaseResult]]:
    """(position in `cases`, result) for every case, run by `impl` on `ranks` ranks (split `tp` x
    `cp` x DP), in order, one launch for all of them while no rank fails.  Never raises for a
    rank that dies or hangs: that case is a crash or a timeout."""
    with RankGroup(ranks, case_timeout, tp, cp) as group:
        for case in cases:
            group.submit(case, impl, iterations)
        for position in range(len(cases)):
            yield position, group.next_result()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (read from /proc; empty where there is none): the launcher
    starts each rank in a session of its own, so killing the launcher's group misses them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(process: subprocess.Popen) -> None:
    """The launcher and every rank it started: nothing is left running."""
    below = _descendants(process.pid)  # before the launcher dies and its ranks are orphaned
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
