"""The bundled checkpoint: reentrant (autograd.Function) and non-reentrant (saved-tensor hooks).

Both flavours nest: a region met during a recompute takes a fresh snapshot, which is right because
the outer rewind already put every stream back where the forward had it.  The RNG handling is
delegated to an `RNGPolicy`, so the negative controls differ from this code in one method only.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .context import ForwardContext
from .rng import CAPTURE_STRATEGIES, RNGPolicy, ValuePolicy, _capturing, resolve_capture_strategy
from .stash import RNGStash

_POLICIES = {name: ValuePolicy() for name in CAPTURE_STRATEGIES}
for _name, _policy in _POLICIES.items():
    _policy.capture_strategy = _name


def checkpoint(
    fn: Callable[..., Any],
    *args: Any,
    reentrant: bool = False,
    tracker: Any = None,
    policy: RNGPolicy | None = None,
    capture_strategy: str = "auto",
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` as a checkpointed region; its activations are recomputed in
    backward.

    The recompute draws exactly the forward's random numbers from every live stream (CPU, each
    CUDA device, each stream of `tracker`), runs under the forward's autocast state and SDPA
    backend choice, and afterwards every stream holds the value it had just before the recompute.
    Tensors may come positionally, by keyword or inside lists, tuples and dicts (both modes
    differentiate them all).  Under CUDA-graph capture, `capture_strategy` picks how: 'philox'
    also rewinds the graph's device seed and offset (torch >= 2.14, `Generator.philox_state`;
    sound across separate graphs); 'stash' keeps the region's RNG outputs and hands them back
    (sound across separate graphs, any torch); 'values' rewinds capture-relative host states
    (sound only within one graph); 'auto' is 'philox' where this torch has it, else 'stash'.
    """
    if policy is None:
        resolve_capture_strategy(capture_strategy)  # an unknown name: one ValueError line, said there
        policy = _POLICIES[capture_strategy]
    if reentrant:
        # An autograd.Function sees only its direct tensor arguments: flatten the containers and
        # keywords so that every tensor in them is one, and rebuild them inside.
        flat, spec = tree_flatten((args, kwargs))
        return _ReentrantCheckpoint.apply(fn, policy, tracker, spec, *flat)
    return _checkpoint_with_hooks(fn, args, kwargs, policy, tracker)


def _detached(values: Any) -> Any:
    """Fresh leaves with the same values and requires_grad (inside containers too), for a recompute."""
    return tree_map(lambda a: a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a,
                    values)


class _RegionRNG:
    """A region's RNG record: its value snapshot and, under capture, its kept RNG outputs; and
    the context (autocast, SDPA backend) its forward ran under."""

    def __init__(self, policy: RNGPolicy, tracker: Any) -> None:
        self.policy = policy
        self.stash = RNGStash() if _capturing() and policy.stash_under_capture() else None
        self.snapshot = None if self.stash is not None else policy.snapshot(tracker)
        self.context = ForwardContext()

    def forward(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.stash is None:
            return fn(*args, **kwargs)
        with self.stash:
            return fn(*args, **kwargs)

    def recompute(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self.context.replay():
            if self.stash is not None:  # no redraw: the forward's RNG outputs come back in order
                with torch.enable_grad(), self.stash.replay():
                    return fn(*args, **kwargs)
            return _recompute(fn, args, kwargs, self.policy, self.snapshot)


def _recompute(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], policy: RNGPolicy,
               snap: Any) -> Any:
    """Run `fn` with the RNG rewound to `snap`; streams get their pre-recompute values back."""
    token = policy.rewind(snap)
    try:
        with torch.enable_grad():
            return fn(*args, **kwargs)
    finally:
        policy.restore(token)


class _ReentrantCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, policy, tracker, spec, *flat):  # type: ignore[override]
        ctx.fn, ctx.spec = fn, spec
        ctx.rng = _RegionRNG(policy, tracker)
        ctx.tensor_slots = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        ctx.plain_args = [None if isinstance(a, torch.Tensor) else a for a in flat]
        ctx.save_for_backward(*(flat[i] for i in ctx.tensor_slots))
        args, kwargs = tree_unflatten(list(flat), spec)
        with torch.no_grad():
            return ctx.rng.forward(fn, args, kwargs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        flat = list(ctx.plain_args)
        for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
            flat[slot] = tensor
        inputs = _detached(flat)
        args, kwargs = tree_unflatten(list(inputs), ctx.spec)
        outputs = ctx.rng.recompute(ctx.fn, args, kwargs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [
            (out, grad)
            for out, grad in zip(outputs, grads)
            if isinstance(out, torch.Tensor) and out.requires_grad and grad is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = tuple(a.grad if isinstance(a, torch.Tensor) else None for a in inputs)
        return (None, None, None, None) + input_grads


class _HookFrame:
    """One non-reentrant region: its inputs, RNG snapshot and (after recompute) saved tensors."""

    def __init__(self, fn, args, kwargs, rng: _RegionRNG) -> None:
        # Keep the inputs' values, not the tensors: a tensor with a grad_fn would tie this frame
        # into the autograd graph whose hooks point back at it, a cycle through C++ nodes that
        # Python's garbage collector cannot free (a leak of every region's inputs).
        self.fn, self.args, self.kwargs, self.rng = fn, _detached(args), _detached(kwargs), rng
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

        def keep(tensor: torch.Tensor) -> int:
            slot = len(saved)
            saved[slot] = tensor.detach()  # the value only: no tie to the recompute graph
            # Not the tensor itself: a node that saves its own output (softmax in attention) would
            # then hold that output, whose grad_fn is the node, a cycle through C++ that Python's
            # collector cannot free (every attention region's recompute leaked).  The recompute's
            # graph is never differentiated; its nodes need only a token.
            return slot

        with torch.autograd.graph.saved_tensors_hooks(keep, saved.__getitem__):
            self.rng.recompute(self.fn, _detached(self.args), _detached(self.kwargs))  # fresh leaves per recompute
        if len(saved) != self.packed:
            raise RuntimeError(
                f"checkpoint recompute saved {len(saved)} tensors, forward saved {self.packed}: "
                "the region is not deterministic in structure"
            )
        return saved


def _checkpoint_with_hooks(fn, args, kwargs, policy, tracker):
    frame = _HookFrame(fn, args, kwargs, _RegionRNG(policy, tracker))
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return frame.rng.forward(fn, args, kwargs)
