"""The cross-rank oracle (issue 41), ``rank-streams``: across a tensor-parallel group, an RNG output
drawn from a stream seeded per TP rank (the shards each rank holds) must differ on every pair of
ranks, and one drawn from a stream seeded alike (activations every rank replicates) must be the
same on every rank, bit for bit, in the forward and again in the recompute.

Each rank reduces its records to digests (`digests`): per (iteration, site, phase) a hash of the
integer view of every output it recorded there, so ranks compare by exchanging a few strings.
"""

from __future__ import annotations

import hashlib
from itertools import combinations
from typing import Iterable, Mapping, Sequence

from ..results import Mismatch
from .compare import int_view
from .records import MaskLog

Digests = dict[str, str]  # "iteration/site/phase" -> hex digest


def digests(log: MaskLog, sites: Iterable[str]) -> Digests:
    """The digest of each (iteration, site, phase) of `log` for the named `sites` (their RNG
    outputs: the masks and random tensors they drew, in call order)."""
    wanted = set(sites)
    out: Digests = {}
    for (iteration, name, phase), tensors in sorted(log.masks.items()):
        if name not in wanted:
            continue
        hasher = hashlib.sha1()
        for tensor in tensors:
            hasher.update(int_view(tensor).cpu().contiguous().numpy().tobytes())
        out[f"{iteration}/{name}/{phase}"] = hasher.hexdigest()
    return out


def cross_rank(per_rank: Sequence[Mapping[str, str]], per_tp_rank: Mapping[str, str]) -> list[Mismatch]:
    """The ``rank-streams`` mismatches of one run over its ranks' `digests`: `per_tp_rank` maps
    each site drawing from a stream seeded per TP rank to that stream's name (it must differ on
    every pair of ranks); every other site must be equal on all ranks.  A key some rank lacks is
    a mismatch too (that rank did not draw there)."""
    out: list[Mismatch] = []
    keys = sorted(set().union(*per_rank), key=lambda k: (int(k.split("/")[0]), k))
    pairs = list(combinations(range(len(per_rank)), 2))
    for key in keys:
        iteration, site, phase = key.split("/", 2)
        values = [digest.get(key) for digest in per_rank]
        missing = [rank for rank, value in enumerate(values) if value is None]
        if missing:
            out.append(Mismatch("rank-streams", site, int(iteration), len(missing), len(values),
                                detail=f"{phase}: rank {', '.join(map(str, missing))} recorded no output here"))
            continue
        stream = per_tp_rank.get(site)
        if stream is not None:
            alike = [(a, b) for a, b in pairs if values[a] == values[b]]
            if alike:
                shown = ", ".join(f"{a} and {b}" for a, b in alike[:3])
                out.append(Mismatch("rank-streams", site, int(iteration), len(alike), len(pairs),
                                    detail=f"{phase}: ranks {shown} drew the same numbers from {stream}, which is "
                                           "seeded per tensor-parallel rank: they must differ"))
        else:
            other = [rank for rank, value in enumerate(values) if value != values[0]]
            if other:
                out.append(Mismatch("rank-streams", site, int(iteration), len(other), len(values),
                                    detail=f"{phase}: rank {', '.join(map(str, other))} drew other numbers than "
                                           "rank 0 from a stream every rank seeds alike: they must be equal"))
    return out
