"""Not redrawing: keep the outputs of a region's RNG ops from forward, hand them back in recompute.

This is the capture strategy that is sound across separate CUDA graphs on any torch with CUDA
graphs: the backward graph's Philox base offset is not the forward's, so no host-side rewind can
line a redraw up with the forward, but returning the forward's outputs needs no RNG at all.  Under
capture the kept outputs are tensors of the forward graph's pool, rewritten by every forward
replay.  Memory: one copy of each RNG op's outputs (for dropout, its output and mask).

Every op tagged `nondeterministic_seeded` (dropout, bernoulli, rand, randn, ...) is intercepted by
a `TorchDispatchMode`, below autograd, so autograd records the op as usual with the kept outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


def is_seeded(func: Any) -> bool:
    """True for an op that draws random numbers (tagged ``nondeterministic_seeded``)."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def _is_inplace(func: Any) -> bool:
    # torch.Tag.inplace is recent; the schema name ("aten::bernoulli_") says it on every version.
    return func._schema.name.endswith("_")


def _same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy with `t`'s strides, not a compact one, so an op handed its kept outputs back gets
    the layout it produced (kernels may check strides).  It did not make memory-efficient
    attention sound across separate graphs: that stays a declared limit of the bundled adapter.
    Overlapping layouts (a zero stride) are copied compactly."""
    if 0 in t.stride():
        return t.clone()
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _copy(value: Any) -> Any:
    return tree_map(lambda t: _same_layout(t) if isinstance(t, torch.Tensor) else t, value)


class RNGStash(TorchDispatchMode):
    """Records seeded ops' outputs (`recording`) or returns them in order (`replaying`)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[str, Any]] = []
        self.replaying = False
        self.cursor = 0

    def replay(self) -> "RNGStash":
        """Switch to handing back the recorded outputs, from the first."""
        self.replaying, self.cursor = True, 0
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if not is_seeded(func):
            return func(*args, **kwargs)
        if not self.replaying:
            out = func(*args, **kwargs)
            self.outputs.append((str(func), _copy(out)))
            return out
        if self.cursor >= len(self.outputs):
            raise RuntimeError(f"checkpoint recompute drew more RNG ops than its forward ({func})")
        name, kept = self.outputs[self.cursor]
        self.cursor += 1
        if name != str(func):
            raise RuntimeError(f"checkpoint recompute drew {func} where its forward drew {name}")
        if _is_inplace(func):
            return args[0].copy_(kept)
        return _copy(kept)
