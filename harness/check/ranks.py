"""The cross-rank oracle (issue 41), ``rank-streams``: across a tensor-parallel group, an RNG output
drawn from a stream seeded per TP rank (the shards each rank holds) must differ between ranks of
other TP ranks and be equal between ranks of one TP rank (data-parallel replicas), likewise for
the context-parallel streams, and one drawn from a stream seeded alike (activations every rank
replicates) must be the same on every rank, bit for bit, in the forward and again in the
recompute.

Each rank reduces its records to digests (`digests`): per (iteration, site, phase) a hash of the
integer view of every output it recorded there, so ranks compare by exchanging a few strings.
"""

from __future__ import annotations

import hashlib
from itertools import combinations
from typing import Iterable, Mapping, Sequence

from ..rank_context import AXIS_NAMES, STREAM_AXES
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


def _seeded_by(stream: str) -> str:
    return " and ".join(AXIS_NAMES[axis] for axis in STREAM_AXES[stream]) + " rank"


def cross_rank(per_rank: Sequence[Mapping[str, str]], per_rank_streams: Mapping[str, str],
               coordinates: "Sequence[Mapping[str, int]] | None" = None) -> list[Mismatch]:
    """The ``rank-streams`` mismatches of one run over its ranks' `digests`: `per_rank_streams`
    maps each site drawing from a stream seeded per rank (`rank_context.STREAM_AXES`) to that
    stream's name; `coordinates` is each rank's place in the layout (default: TP = the whole
    group).  Two ranks must draw the same numbers at such a site where they share their place on
    every axis the stream's seed depends on, and different numbers where they do not; every
    other site must be equal on all ranks.  A key some rank lacks is a mismatch too (that rank
    did not draw there)."""
    coords = (list(coordinates) if coordinates is not None
              else [{"tp": n, "cp": 0, "dp": 0} for n in range(len(per_rank))])
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
        stream = per_rank_streams.get(site)
        axes = STREAM_AXES.get(stream, ()) if stream is not None else ()
        if not axes:
            other = [rank for rank, value in enumerate(values) if value != values[0]]
            if other:
                out.append(Mismatch("rank-streams", site, int(iteration), len(other), len(values),
                                    detail=f"{phase}: rank {', '.join(map(str, other))} drew other numbers than "
                                           "rank 0 from a stream every rank seeds alike: they must be equal"))
            continue
        same_place = {(a, b): all(coords[a][axis] == coords[b][axis] for axis in axes) for a, b in pairs}
        alike = [(a, b) for a, b in pairs if values[a] == values[b] and not same_place[(a, b)]]
        unlike = [(a, b) for a, b in pairs if values[a] != values[b] and same_place[(a, b)]]
        if alike:
            shown = ", ".join(f"{a} and {b}" for a, b in alike[:3])
            out.append(Mismatch("rank-streams", site, int(iteration), len(alike), len(pairs),
                                detail=f"{phase}: ranks {shown} drew the same numbers from {stream}, which is "
                                       f"seeded per {_seeded_by(stream)}: they must differ"))
        if unlike:
            shown = ", ".join(f"{a} and {b}" for a, b in unlike[:3])
            out.append(Mismatch("rank-streams", site, int(iteration), len(unlike), len(pairs),
                                detail=f"{phase}: ranks {shown} drew other numbers from {stream}, seeded per "
                                       f"{_seeded_by(stream)}, which they share: they must be equal"))
    return out
