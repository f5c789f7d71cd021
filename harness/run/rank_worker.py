"""One rank of a `--ranks N` run (issue 41), started by torch.distributed's launcher
(``python -m torch.distributed.run --standalone --nproc-per-node N -m harness.run.rank_worker
SPEC OUT``; `harness.run.ranks` starts it).

Every rank joins a gloo process group (CPU tensors, on any machine; the cases themselves run on
their own device), runs as its rank (`rank_context`: tracker streams seeded per TP rank as
Megatron does) and runs the cases of SPEC in order, each against its own reference.  After each
case the ranks exchange digests of their RNG outputs (`check.ranks`) and every rank appends one
JSON line to OUT/rank<R>.jsonl: ``{"index", "result"}`` (the case's record), rank 0 with the
cross-rank mismatches of the checkpointed run (``cross``) and of the reference (``cross_reference``).
A ``{"index", "start"}`` line comes first, so the parent knows which case a dead or hung rank was in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .. import impls, rank_context
from ..check.ranks import cross_rank, digests
from ..model import ops
from ..model.cases import parse_case_id
from .runner import run
from .workload import case_streams


def _sites(case: Any) -> tuple[list[str], dict[str, str]]:
    """The drawing sites of `case`, and those drawing from a stream seeded per TP rank (-> its name)."""
    streams = case_streams(case)
    drawing = [site.name for site in case.program.sites() if ops.REGISTRY[site.op].draws]
    per_rank = {name: streams[name] for name in drawing
                if streams[name] is not None and streams[name] in rank_context.PER_TP_RANK}
    return drawing, per_rank  # type: ignore[return-value]


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out_dir = Path(argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rank_context.enter(rank, world)
    dist.init_process_group("gloo")
    try:
        impl = impls.load(spec["impl"])
        with open(out_dir / f"rank{rank}.jsonl", "a", buffering=1) as out:
            for index, case_id in zip(spec["indexes"], spec["cases"]):
                out.write(json.dumps({"index": index, "start": True}) + "\n")
                case = parse_case_id(case_id)
                result = run(case, impl, spec.get("iterations"), name=spec["impl"], keep_masks=True)
                drawing, per_rank = _sites(case)
                mine = {run_name: digests(log, drawing) for run_name, log in result.masks.items()}
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, mine)
                line: dict[str, Any] = {"index": index, "result": result.to_dict()}
                if rank == 0 and all(g for g in gathered):  # every rank ran both runs
                    for run_name, key in (("checkpointed", "cross"), ("reference", "cross_reference")):
                        found = cross_rank([g[run_name] for g in gathered], per_rank)
                        line[key] = [m.to_dict() for m in found]
                out.write(json.dumps(line) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
