"""Which rank of a tensor-parallel group this process runs as, and the stream seeds that follow
(issue 41).  One process is rank 0 of 1, and every seed is what it always was.

Seeds follow Megatron-core's ``model_parallel_cuda_manual_seed`` with the tensor-parallel group
the whole world (TP = N): the default generators and the data-parallel stream get one seed on
every rank (activations every rank replicates draw the same masks); the tensor-model-parallel
stream (``model-parallel-rng``), the expert-parallel and the model-and-context-parallel streams
add the TP rank, times `TP_SEED_STRIDE` (the shards each rank holds draw different masks).  The context-parallel stream
is seeded by the context-parallel rank, 0 everywhere here (no context parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

# The streams whose seed adds the TP rank (Megatron-core: tensor_model_parallel_seed = seed +
# 2718 + tp_rank; expert and model-and-context streams carry the TP rank too).
PER_TP_RANK = frozenset({"model-parallel-rng", "expert-parallel-rng", "model-and-context-parallel-rng"})


@dataclass(frozen=True)
class RankContext:
    """This process's place in the group: ``rank`` of ``world``; TP is the whole world."""

    rank: int = 0
    world: int = 1

    @property
    def tp_rank(self) -> int:
        return self.rank


_current = RankContext()


def current() -> RankContext:
    """The rank this process runs as (rank 0 of 1 unless `enter` said otherwise)."""
    return _current


def enter(rank: int, world: int) -> RankContext:
    """Run as `rank` of `world` from now on (a rank worker calls it once, at its start)."""
    global _current
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    _current = RankContext(rank, world)
    return _current


# Megatron adds the TP rank itself to the seed; the harness's streams have neighbouring seeds
# (2718 for the tracked stream, 2719 on for the others), and Megatron's and DeepSpeed's trackers
# refuse a seed twice ("seed 2719 already exists", seen on the H200 at rank 1), so the offset here
# is a stride of the TP rank that no rank's seed can meet another stream's with.
TP_SEED_STRIDE = 1000


def stream_seed(name: str, base: int) -> int:
    """The seed a tracker stream named `name` gets on this rank, from its one-process seed."""
    return base + TP_SEED_STRIDE * current().tp_rank if name in PER_TP_RANK else base
