"""One rank of a `--ranks N` run (issue 41), started by torch.distributed's launcher
(``python -m torch.distributed.run --standalone --nproc-per-node N -m harness.run.rank_worker
SPEC FOLDER``; `harness.run.ranks` starts it).

Every rank joins a gloo process group (CPU tensors, on any machine; the cases themselves run on
their own device), runs as its rank of the layout SPEC names (`rank_context`: TP x CP x DP,
tracker streams seeded per rank as Megatron does) and follows FOLDER/queue.jsonl, which the
parent appends to: a line ``{"index", "case", "impl", "iterations"}`` is a case to run against
its own reference, ``{"stop": true}`` the end.  Every rank reads the same lines, so the ranks run
the same cases in the same order.  After each case the ranks exchange digests of their RNG
outputs (`check.ranks`) and every rank appends one JSON line to FOLDER/rank<R>.jsonl: ``{"index",
"result"}`` (the case's record), rank 0 with the cross-rank mismatches of the checkpointed run
(``cross``) and of the reference (``cross_reference``).  A ``{"index", "start"}`` line comes
first, so the parent knows which case a dead or hung rank was in.  A rank whose parent process
(the one that started the launcher) is gone stops on its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch.distributed as dist

from .. import impls, rank_context
from ..check.ranks import cross_rank, digests
from ..model import ops
from ..model.cases import parse_case_id
from .runner import run
from .workload import case_streams

# How often an idle rank looks for the next case: at once after one came (the fuzzer queues the
# next program as soon as it has judged one), then less often the longer none does.
IDLE_POLL_MIN_S, IDLE_POLL_MAX_S = 0.001, 0.02
PARENT_CHECK_S = 1.0


def _sites(case: Any) -> tuple[list[str], dict[str, str]]:
    """The sites of `case` the ranks compare, and those drawing from a stream seeded per rank (->
    its name).  Only sites whose record is the draw itself (`ops.RECORDS_THE_DRAW`): an output
    (F.dropout, attention) carries its input too, which differs across ranks wherever an earlier
    draw from a stream seeded per rank does; every rank's own oracles still check those sites."""
    streams = case_streams(case)
    drawing = [site.name for site in case.program.sites() if site.op.value in ops.RECORDS_THE_DRAW]
    per_rank = {name: streams[name] for name in drawing
                if streams[name] is not None and streams[name] in rank_context.STREAM_AXES}
    return drawing, per_rank  # type: ignore[return-value]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orders(queue: Path, parent: int) -> Iterator[dict[str, Any]]:
    """The lines of `queue` as the parent appends them (a line still being written is read when
    it is whole), up to a stop line; ends early when the `parent` process is gone."""
    checked, wait = time.monotonic(), IDLE_POLL_MIN_S
    while not queue.exists():
        time.sleep(IDLE_POLL_MIN_S)
    with open(queue, "rb") as source:
        pending = b""
        while True:
            chunk = source.readline()
            if chunk:
                wait = IDLE_POLL_MIN_S
                pending += chunk
                if not pending.endswith(b"\n"):
                    continue
                order = json.loads(pending)
                pending = b""
                if order.get("stop"):
                    return
                yield order
                continue
            if time.monotonic() - checked > PARENT_CHECK_S:
                checked = time.monotonic()
                if not _alive(parent):
                    return
            time.sleep(wait)
            wait = min(wait * 2, IDLE_POLL_MAX_S)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    folder = Path(argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    place = rank_context.enter(rank, world, spec.get("tp", 0), spec.get("cp", 1))
    dist.init_process_group("gloo")
    loaded: dict[str, Any] = {}
    try:
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, place.coordinates())
        with open(folder / f"rank{rank}.jsonl", "a", buffering=1) as out:
            for order in orders(folder / "queue.jsonl", spec["parent"]):
                index = order["index"]
                out.write(json.dumps({"index": index, "start": True}) + "\n")
                if order["impl"] not in loaded:
                    loaded[order["impl"]] = impls.load(order["impl"])
                case = parse_case_id(order["case"])
                result = run(case, loaded[order["impl"]], order.get("iterations"), name=order["impl"], keep_masks=True)
                drawing, per_rank = _sites(case)
                mine = {run_name: digests(log, drawing) for run_name, log in result.masks.items()}
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, mine)
                line: dict[str, Any] = {"index": index, "result": result.to_dict()}
                if rank == 0 and all(g for g in gathered):  # every rank ran both runs
                    for run_name, key in (("checkpointed", "cross"), ("reference", "cross_reference")):
                        found = cross_rank([g[run_name] for g in gathered], per_rank, everyone)
                        line[key] = [m.to_dict() for m in found]
                out.write(json.dumps(line) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
