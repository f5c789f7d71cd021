"""What the impls that split a region's saved input over the tensor-parallel group of ``--ranks N``
share (issue 41): DeepSpeed's ``partition_activations=True`` (`deepspeed-partition`) and Megatron's
``distribute_saved_activations=True`` (`megatron-distribute`).  Both keep each rank's slice of the
input in the forward and all-gather it for the recompute, so the input must be the same on every
rank of the group, and the gather must run where the case runs it.
"""

from __future__ import annotations

from typing import Any

from .. import rank_context
from ..axes import Capture
from ..model import ops
from ..model.cases import Case
from ..model.programs import Region, per_rank_codes


def entered_after_rank_draw(case: Case) -> "str | None":
    """The first region (its name) entered after a draw from a stream this rank layout seeds per
    rank (its input may differ between ranks), or None."""
    differing = per_rank_codes(rank_context.current().sizes())
    code = case.streams()
    drawn = False

    def walk(items: Any) -> "str | None":
        nonlocal drawn
        for item in items:
            if isinstance(item, Region):
                if drawn:
                    return item.name
                found = walk(item.items)
                if found:
                    return found
            elif ops.REGISTRY[item.op].draws and code[item.name] in differing:
                drawn = True
        return None

    return walk(case.program.items())


def _group_up() -> bool:
    """Whether this process is in a process group (a rank of ``--ranks N``)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def no_group_reason(what: str) -> "str | None":
    """Why a case of an impl that splits saved inputs over the tensor-parallel group cannot run in
    this process (`what`: the impl's option, for the message), or None where a process group is up."""
    if _group_up():
        return None
    return f"{what} splits each region's saved input over the tensor-parallel group: it needs one (run with --ranks N)"


def uncapturable_gather_reason(case: Case, what: str) -> "str | None":
    """Why the recompute's all-gather of `what` cannot be captured in `case`'s CUDA graph, or None.

    The ranks of ``--ranks N`` on one GPU share a gloo process group (two NCCL ranks cannot share a
    device), and gloo moves a CUDA tensor through host memory and waits for the stream, which a
    capturing stream forbids; NCCL's collectives can be captured, so with one GPU per rank this
    does not apply."""
    import torch.distributed as dist

    if case.capture is Capture.EAGER or not _group_up():
        return None
    backend = str(dist.get_backend())
    if backend != "gloo":
        return None
    return (f"{what} all-gathers the saved input in the recompute, over the {backend} process group the ranks "
            f"sharing one GPU use: gloo copies CUDA tensors through the host and synchronizes the stream, "
            f"which CUDA-graph capture forbids (NCCL, one GPU per rank, can be captured)")
