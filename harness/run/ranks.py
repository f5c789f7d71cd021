"""`--ranks N` (issue 41): each case runs in N processes that form one tensor-parallel group,
started through torch.distributed's own launcher, and its verdict is all ranks'.

`run_ranked` starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
harness.run.rank_worker`` once for a list of cases (one launch, not one per case: starting N
processes that import torch costs seconds) and reads what the ranks append as they go
(`rank_worker`).  A case's result combines its ranks (`combine`): every rank's own oracles (each
rank's checkpointed run against its own reference, mismatches marked with the rank) plus the
cross-rank oracle ``rank-streams``.  A launch that dies is that case's crash, one that stops
making progress for the case time limit its timeout: the launcher and every rank below it are
killed (no rank is left running) and a new launch takes the cases after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence

from ..model.cases import Case
from ..results import Mismatch, Outcome
from .runner import CaseResult, result_from_dict

POLL_S = 0.05
# The launcher's start (N processes importing torch, joining the group) is not the first case's
# time: until a rank starts a case the limit is this, or the case limit where that is longer.
STARTUP_S = 120.0
LAUNCHER = ("-m", "torch.distributed.run", "--standalone", "--max-restarts=0")


def _progress(folder: Path, ranks: int) -> tuple[list[dict[int, dict[str, Any]]], set[int]]:
    """What the ranks have written so far, one read of each file: per rank, case index -> its
    result line; and the case indexes some rank has started."""
    results: list[dict[int, dict[str, Any]]] = []
    started: set[int] = set()
    for rank in range(ranks):
        found: dict[int, dict[str, Any]] = {}
        path = folder / f"rank{rank}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                break  # a line still being written
            started.add(data["index"])
            if "result" in data:
                found[data["index"]] = data
        results.append(found)
    return results, started


def combine(case: Case, impl: str, lines: Sequence[dict[str, Any]]) -> CaseResult:
    """One case's result from its ranks' lines (rank order): an error or an unsupported answer of
    any rank is the case's (naming the rank); else its mismatches are every rank's own (subject
    marked ``@rank R``) and the cross-rank ones; the reference breaking the rank layout is the
    harness's setup failing, an error."""
    per = [result_from_dict(line["result"]) for line in lines]
    first = per[0]
    result = CaseResult(case, impl, Outcome.PASS, impl_version=first.impl_version, iterations=first.iterations,
                        ranks=len(per), duration_s=max(r.duration_s for r in per))
    result.per_rank = [{"rank": n, "outcome": r.outcome.value, "oracles": sorted({m.oracle for m in r.mismatches}),
                        **({"error": r.error} if r.error else {}), **({"reason": r.reason} if r.reason else {})}
                       for n, r in enumerate(per)]
    for outcome in (Outcome.ERROR, Outcome.UNSUPPORTED, Outcome.SKIPPED):
        hit = [(n, r) for n, r in enumerate(per) if r.outcome is outcome]
        if hit:
            n, r = hit[0]
            result.outcome = outcome
            result.reason, result.traceback = r.reason, r.traceback
            result.error = f"rank {n}: {r.error}" if r.error else ""
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


def _failed(case: Case, impl: str, ranks: int, outcome: Outcome, error: str,
            exits: "dict[int, int] | None" = None) -> CaseResult:
    """A case no rank finished; `exits`: each rank's exit code where the launcher reported it (a
    rank the launcher stopped after another died shows SIGTERM: -15)."""
    result = CaseResult(case, impl, outcome, error=error, ranks=ranks)
    result.per_rank = []
    for n in range(ranks):
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


def run_ranked(impl: str, cases: Sequence[Case], ranks: int, case_timeout: float,
               iterations: "int | None" = None) -> Iterator[tuple[int, CaseResult]]:
    """(position in `cases`, result) for every case, run by `impl` on `ranks` ranks, in order.
    Never raises for a rank that dies or hangs: that case is a crash or a timeout."""
    if ranks < 2:
        raise ValueError("run_ranked needs at least two ranks")
    position = 0
    while position < len(cases):
        position = yield from _launch(impl, cases, position, ranks, case_timeout, iterations)


def _launch(impl: str, cases: Sequence[Case], position: int, ranks: int, case_timeout: float,
            iterations: "int | None") -> Generator[tuple[int, CaseResult], None, int]:
    """One launch for the cases from `position` on; returns where the next launch starts (after a
    crash or timeout) or the end."""
    todo = list(range(position, len(cases)))
    with tempfile.TemporaryDirectory(prefix="harness-ranks-") as tmp:
        folder = Path(tmp)
        spec = folder / "spec.json"
        spec.write_text(json.dumps({"impl": impl, "indexes": todo, "cases": [cases[i].id for i in todo],
                                    "iterations": iterations}))
        log = folder / "launcher.log"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TORCHELASTIC_ERROR_FILE": str(folder / "error.json")}
        with open(log, "w") as sink:
            process = subprocess.Popen(
                [sys.executable, *LAUNCHER, f"--nproc-per-node={ranks}", "-m", "harness.run.rank_worker",
                 str(spec), str(folder)], stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        done: set[int] = set()
        since, started = time.monotonic(), -1  # the clock of the case in progress, which case it times
        try:
            while True:
                lines, started_cases = _progress(folder, ranks)
                for index in todo:
                    if index not in done and all(index in per for per in lines):
                        done.add(index)
                        since = time.monotonic()
                        yield index, combine(cases[index], impl, [per[index] for per in lines])
                pending = [i for i in todo if i not in done]
                if not pending:
                    process.wait()
                    return len(cases)
                current = pending[0]
                if started != current and current in started_cases:
                    since, started = time.monotonic(), current  # its own time starts when a rank starts it
                code = process.poll()
                if code is not None:
                    # (the ranks write before they exit: read once more before calling it a crash)
                    lines, started_cases = _progress(folder, ranks)
                    if all(current in per for per in lines):
                        continue
                    where = "while running it" if current in started_cases else "before it started"
                    exits = _exits(log)
                    dead = [f"rank {n} (exit code {c})" for n, c in sorted(exits.items()) if c != -signal.SIGTERM]
                    who = f"{', '.join(dead)} died" if dead else "a rank died"
                    yield current, _failed(cases[current], impl, ranks, Outcome.CRASH,
                                           f"{who} {where}; the launcher stopped the others (launcher exit {code}): "
                                           f"{_tail(log)}", exits)
                    return current + 1
                limit = case_timeout if started == current else max(case_timeout, STARTUP_S)
                if time.monotonic() - since > limit:
                    _kill(process)
                    what = (f"not every rank finished the case within {case_timeout:g} s" if started == current
                            else f"no rank started the case within {limit:g} s of the last")
                    yield current, _failed(cases[current], impl, ranks, Outcome.TIMEOUT,
                                           f"{what}: every rank and the launcher were killed")
                    return current + 1
                time.sleep(POLL_S)
        finally:
            if process.poll() is None:
                _kill(process)


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
