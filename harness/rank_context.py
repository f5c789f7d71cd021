"""Which rank of a parallel layout this process runs as, and the stream seeds that follow
(issue 41).  One process is rank 0 of 1, and every seed is what it always was.

A world of N ranks is split as Megatron-core splits it (its default order ``tp-cp-ep-dp-pp``: the
tensor-parallel rank varies fastest): ``TP x CP x DP = N``, TP = N unless told otherwise.  Seeds
follow Megatron-core's ``model_parallel_cuda_manual_seed``: the default generators and the
data-parallel stream get one seed on every rank (activations every rank replicates draw the same
masks); the tensor-model-parallel stream (``model-parallel-rng``) and the expert-parallel stream
add the TP rank (the shards each rank holds draw different masks; expert TP = TP here); the
context-parallel stream adds the context-parallel rank and the model-and-context-parallel stream
both (Megatron-LM PR #4828's streams: each CP rank holds another chunk of the sequence).  Each
stream's offset is a multiple of `TP_SEED_STRIDE` (`stream_seed`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The axes each tracker stream's seed depends on (every stream not named here: none, the same
# numbers on every rank).  Megatron-core: tensor_model_parallel_seed = seed + 2718 + tp_rank.
STREAM_AXES: dict[str, tuple[str, ...]] = {
    "model-parallel-rng": ("tp",),
    "expert-parallel-rng": ("tp",),
    "context-parallel-rng": ("cp",),
    "model-and-context-parallel-rng": ("tp", "cp"),
}
# The streams whose seed adds the TP rank (Megatron-core: tensor_model_parallel_seed = seed +
# 2718 + tp_rank; expert and model-and-context streams carry the TP rank too).
PER_TP_RANK = frozenset(name for name, axes in STREAM_AXES.items() if "tp" in axes)
AXIS_NAMES = {"tp": "tensor-parallel", "cp": "context-parallel", "dp": "data-parallel"}


@dataclass(frozen=True)
class RankContext:
    """This process's place in the layout: ``rank`` of ``world``, split ``tp x cp x dp`` (tp 0:
    the whole world)."""

    rank: int = 0
    world: int = 1
    tp: int = 0
    cp: int = 1

    def __post_init__(self) -> None:
        if self.tp == 0:
            object.__setattr__(self, "tp", self.world // self.cp)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def cp_rank(self) -> int:
        return (self.rank // self.tp) % self.cp

    @property
    def dp_rank(self) -> int:
        return self.rank // (self.tp * self.cp)

    def coordinates(self) -> dict[str, int]:
        """This rank's place on each axis: ``{"tp": .., "cp": .., "dp": ..}``."""
        return {"tp": self.tp_rank, "cp": self.cp_rank, "dp": self.dp_rank}

    def seed_offset(self, name: str) -> int:
        """What this rank adds to the one-process seed of the stream `name` (0 for a stream every
        rank seeds alike): `TP_SEED_STRIDE` times this rank's index among the ranks that must
        draw differently from it."""
        index = 0
        for axis in STREAM_AXES.get(name, ()):
            index = index * getattr(self, axis) + self.coordinates()[axis]
        return TP_SEED_STRIDE * index

    def sizes(self) -> dict[str, int]:
        """The size of each axis: ``{"tp": .., "cp": .., "dp": ..}``."""
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp}

    def label(self) -> str:
        """The layout as records and reports name it: ``tp2`` or ``tp2xcp2xdp1``."""
        return f"tp{self.tp}" if self.world == self.tp else f"tp{self.tp}xcp{self.cp}xdp{self.dp}"


def sizes(label: str) -> dict[str, int]:
    """The axis sizes a `RankContext.label` names: ``tp2`` -> tp 2, cp 1, dp 1."""
    out = {"tp": 1, "cp": 1, "dp": 1}
    for part in label.split("x"):
        if part[:2] in out and part[2:].isdigit():
            out[part[:2]] = int(part[2:])
    return out


def layout_problem(world: int, tp: int = 0, cp: int = 1) -> str | None:
    """Why `world` ranks cannot be split `tp` x `cp` x DP (tp 0: world // cp), or None."""
    if world < 1 or cp < 1 or tp < 0:
        return f"a layout needs positive sizes (ranks {world}, tp {tp}, cp {cp})"
    tp = tp or world // cp
    if tp < 1 or world % (tp * cp):
        return f"{world} ranks cannot be split into TP {tp} x CP {cp} x DP (TP x CP must divide the rank count)"
    return None


# What one rank may take of the host: a CPU rank that imported torch holds about 210 MB, a CUDA
# rank more (its context); a rank is budgeted 1 GiB of the memory available when the run starts.
RANK_HOST_BYTES = 1 << 30
RANKS_PER_CORE = 4  # ranks mostly wait on each other (gloo); more than this per core only thrashes


def available_memory_bytes() -> "int | None":
    """MemAvailable of /proc/meminfo (what new processes can take without swapping), None where
    there is no such file."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def max_ranks(cores: "int | None" = None, memory: "int | None" = None) -> tuple[int, str]:
    """The most ranks this machine holds at once, and why (its cores and available memory):
    ``--ranks`` above it is refused before a launcher starts N processes that import torch."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    memory = memory if memory is not None else available_memory_bytes()
    bound, why = RANKS_PER_CORE * cores, f"{RANKS_PER_CORE} per core on {cores} cores"
    if memory is not None and memory // RANK_HOST_BYTES < bound:
        bound = memory // RANK_HOST_BYTES
        why = f"{RANK_HOST_BYTES >> 30} GiB a rank of the {memory / (1 << 30):.1f} GiB of memory available"
    return max(bound, 2), why


def options_problem(ranks: int, tp: int = 0, cp: int = 1) -> str | None:
    """What is wrong with the options ``--ranks N --tp K --cp K`` together, one line (None when
    nothing): the fronts' one check of them.  N is bounded by what the machine holds (`max_ranks`)."""
    if ranks < 1:
        return f"--ranks must be 1 or more, got {ranks}"
    if ranks > 1:
        bound, why = max_ranks()
        if ranks > bound:
            return f"--ranks {ranks}: this machine holds at most {bound} ranks at once ({why})"
    if ranks > 1:
        problem = layout_problem(ranks, tp, cp)
        return f"--ranks/--tp/--cp: {problem}" if problem else None
    if tp or cp != 1:
        return "--tp and --cp split the ranks of --ranks N (N > 1): give --ranks too"
    return None


_current = RankContext()


def current() -> RankContext:
    """The rank this process runs as (rank 0 of 1 unless `enter` said otherwise)."""
    return _current


def enter(rank: int, world: int, tp: int = 0, cp: int = 1) -> RankContext:
    """Run as `rank` of `world` (split `tp` x `cp` x DP) from now on (a rank worker calls it
    once, at its start)."""
    global _current
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    problem = layout_problem(world, tp, cp)
    if problem:
        raise ValueError(problem)
    _current = RankContext(rank, world, tp, cp)
    return _current


# Megatron adds the TP rank itself to the seed; the harness's streams have neighbouring seeds
# (2718 for the tracked stream, 2719 on for the others), and Megatron's and DeepSpeed's trackers
# refuse a seed twice ("seed 2719 already exists", seen on the H200 at rank 1), so the offset here
# is a stride of the TP rank that no rank's seed can meet another stream's with.
TP_SEED_STRIDE = 1000


def stream_seed(name: str, base: int) -> int:
    """The seed a tracker stream named `name` gets on this rank, from its one-process seed."""
    return base + current().seed_offset(name)
