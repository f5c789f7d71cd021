"""The bundled checkpoint: reentrant (autograd.Function) and non-reentrant (saved-tensor hooks).

Both flavours nest: a region met during a recompute takes a fresh snapshot, which is right because
the outer rewind already put every stream back where the forward had it.  The RNG handling is
delegated to an `RNGPolicy`, so the negative controls differ from this code in one method only.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .rng import RNGPolicy, ValuePolicy

VALUE_POLICY = ValuePolicy()


def checkpoint(
    fn: Callable[..., Any],
    *args: Any,
    reentrant: bool = False,
    tracker: Any = None,
    policy: RNGPolicy = VALUE_POLICY,
) -> Any:
    """Run ``fn(*args)`` as a checkpointed region; its activations are recomputed in backward.

    The recompute draws exactly the forward's random numbers from every live stream (CPU, each
    CUDA device, each stream of `tracker`), and afterwards every stream holds the value it had just
    before the recompute.
    """
    if reentrant:
        return _ReentrantCheckpoint.apply(fn, policy, tracker, *args)
    return _checkpoint_with_hooks(fn, args, policy, tracker)


def _detached(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Fresh leaves with the same values and requires_grad, for a recompute."""
    return tuple(
        a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    )


def _recompute(fn: Callable[..., Any], args: tuple[Any, ...], policy: RNGPolicy, snap: Any) -> Any:
    """Run `fn` with the RNG rewound to `snap`; streams get their pre-recompute values back."""
    token = policy.rewind(snap)
    try:
        with torch.enable_grad():
            return fn(*args)
    finally:
        policy.restore(token)


class _ReentrantCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, policy, tracker, *args):  # type: ignore[override]
        ctx.fn, ctx.policy = fn, policy
        ctx.rng = policy.snapshot(tracker)
        ctx.tensor_slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.plain_args = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_slots))
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        args = list(ctx.plain_args)
        for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
            args[slot] = tensor
        inputs = _detached(tuple(args))
        outputs = _recompute(ctx.fn, inputs, ctx.policy, ctx.rng)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [
            (out, grad)
            for out, grad in zip(outputs, grads)
            if isinstance(out, torch.Tensor) and out.requires_grad and grad is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = tuple(a.grad if isinstance(a, torch.Tensor) else None for a in inputs)
        return (None, None, None) + input_grads


class _HookFrame:
    """One non-reentrant region: its inputs, RNG snapshot and (after recompute) saved tensors."""

    def __init__(self, fn, args, policy, rng) -> None:
        self.fn, self.args, self.policy, self.rng = fn, args, policy, rng
        self.packed = 0
        self.recomputed: dict[int, torch.Tensor] | None = None

    def pack(self, tensor: torch.Tensor) -> int:
        slot = self.packed
        self.packed += 1
        return slot  # the tensor itself is dropped: that is the point of checkpointing

    def unpack(self, slot: int) -> torch.Tensor:
        if self.recomputed is None:
            self.recomputed = self._recompute_saved()
        return self.recomputed[slot]

    def _recompute_saved(self) -> dict[int, torch.Tensor]:
        saved: dict[int, torch.Tensor] = {}

        def keep(tensor: torch.Tensor) -> torch.Tensor:
            saved[len(saved)] = tensor
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            _recompute(self.fn, _detached(self.args), self.policy, self.rng)
        if len(saved) != self.packed:
            raise RuntimeError(
                f"checkpoint recompute saved {len(saved)} tensors, forward saved {self.packed}: "
                "the region is not deterministic in structure"
            )
        return saved


def _checkpoint_with_hooks(fn, args, policy, tracker):
    frame = _HookFrame(fn, args, policy, policy.snapshot(tracker))
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return fn(*args)
