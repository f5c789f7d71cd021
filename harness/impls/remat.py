"""torch_remat (PyPI ``torch-remat``, issue 38): its checkpoint with no RNG hook, with the hook
its README shows, and with the harness's own hook (`harness.checkpoint.RecomputeRNGHook`).

``remat.checkpoint(region_name=..., recompute_state_hooks=(...))(fn)(*args, **kwargs)`` runs
torch's non-reentrant checkpoint with ``preserve_rng_state=False`` (it refuses ``True``): only its
hooks put random state back, at region entry and around each SAVE region, and it forks the state
around the recompute itself.  Nested checkpoints raise NotImplementedError, and it has no
reentrant form: both are declared, not run.

* ``remat``: no hook.  Every recompute draws from the live streams and leaves them advanced.
* ``remat-readme-hook``: the README's ``CudaRNGStateHook`` reproduced as written: the CUDA
  generator of the region input's device, and a user counter.  No CPU generator (on a CPU case it
  raises: ``torch.cuda.get_rng_state`` of a CPU device), no tracker streams.
* ``remat-hook``: `RecomputeRNGHook` with the case's tracker: every live stream by value.  Like
  ``bundled``, it must pass every case it supports.
"""

from __future__ import annotations

import contextvars
import sys
from contextvars import ContextVar
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from ..checkpoint import RecomputeRNGHook
from ..checkpoint.rng import philox_available
from ..model.cases import Capture, Case, Mode
from .limits import Axis, Limit, declared, limit
from .packages import LazyModule, PackageAdapter

REMAT = LazyModule("torch_remat")

# The README's example, as written there (a user RNG counter beside torch's CUDA generator).
rng_counter: ContextVar[int] = ContextVar("rng_counter", default=0)


class CudaRNGStateHook:
    """torch_remat's README hook, verbatim but for the names: one CUDA device's generator state
    and a user counter."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def snapshot(self) -> Any:
        return torch.cuda.get_rng_state(self.device), rng_counter.get()

    def restore(self, state: Any) -> None:
        cuda_rng_state, counter = state
        torch.cuda.set_rng_state(cuda_rng_state, self.device)
        rng_counter.set(counter)


def drawing_in_save_region() -> bool:
    """Whether the code running now is the body of a torch_remat SAVE region in its forward
    (``remat.region(..., recompute=False)``): its draws are kept, not rerun, by design.  Asked of
    torch_remat's own state where it is loaded and has it (0.2: the ``_active_save_op`` context
    variable of ``torch_remat._region``); False otherwise (torch_remat is never imported for it)."""
    region = sys.modules.get("torch_remat._region")
    active = getattr(region, "_active_save_op", None)
    return active is not None and active.get() is not None


def _input_device(args: tuple, kwargs: dict, tracker: Any) -> torch.device:
    """``hidden_states.device``: the first tensor the region receives (the tracker's device for a
    region that receives none)."""
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if tensors:
        return tensors[0].device
    return torch.device(getattr(tracker, "device", None) or "cpu")


class RematAdapter(PackageAdapter):
    name = "remat"
    package = "torch_remat"
    distributions = ("torch-remat", "torch_remat")
    top_module = "torch_remat"
    description = "torch_remat.checkpoint with no RecomputeStateHook (its default: no RNG restore)"

    @staticmethod
    def lazy() -> LazyModule:
        return REMAT

    def hooks(self, args: tuple, kwargs: dict, tracker: Any) -> tuple:
        """The ``recompute_state_hooks`` of one checkpoint call."""
        return ()

    def declared_limits(self) -> tuple[Limit, ...]:
        """torch_remat's own limits: no reentrant form, no nested checkpoints."""
        return (limit(Axis.MODE, [Mode.REENTRANT], "torch_remat.checkpoint is non-reentrant only "
                      "(torch's checkpoint with use_reentrant=False)"),
                limit(Axis.NESTING, [True], "nested torch_remat.checkpoint regions are not supported "
                      "(torch_remat raises NotImplementedError)"))

    def supports(self, case: Case) -> str | None:
        """None where torch_remat imports and `case` is inside its declared limits, else why not."""
        return self.unavailable() or declared(self.declared_limits(), case)

    def save_region(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``remat.region(fn, name, recompute=False)``: kept, not rerun in the recompute; its output
        marked as needed by the recompute that follows (``recompute_needs_tensor``)."""
        remat = self.module()

        def saved(*args: Any) -> Any:
            out = remat.region(fn, name, recompute=False)(*args)
            remat.recompute_needs_tensor(out)
            return out

        return saved

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        remat = self.module()
        hooks = self.hooks(args, kwargs, tracker)
        call = remat.checkpoint(region_name=getattr(fn, "__name__", None), recompute_state_hooks=hooks)(fn)
        # In a copy of the context: torch_remat 0.2.2 leaves its region context variable set when
        # a hook's snapshot() raises at region entry, and every later checkpoint call in that
        # context then raises "nested torch_remat.checkpoint regions are not supported"
        # (findings/torch-remat-hook-error-poisons-context.md).  The case that raised is that
        # case's error; the copy keeps the leak from failing the next cases of the worker.
        return contextvars.copy_context().run(call, *args, **kwargs)


class ReadmeHookAdapter(RematAdapter):
    name = "remat-readme-hook"
    description = "torch_remat.checkpoint with its README's CudaRNGStateHook (one CUDA generator and a counter)"

    def hooks(self, args: tuple, kwargs: dict, tracker: Any) -> tuple:
        return (CudaRNGStateHook(_input_device(args, kwargs, tracker)),)


class HookAdapter(RematAdapter):
    name = "remat-hook"
    must_support_all = True  # like bundled: every case it supports, right
    description = "torch_remat.checkpoint with harness.checkpoint.RecomputeRNGHook (every live stream by value)"

    def hooks(self, args: tuple, kwargs: dict, tracker: Any) -> tuple:
        return (RecomputeRNGHook(tracker),)

    def declared_limits(self) -> tuple[Limit, ...]:
        """torch_remat's limits, and separate graphs where host values cannot line the recompute up
        (no ``Generator.philox_state`` before torch 2.14)."""
        own = super().declared_limits()
        if philox_available():
            return own
        return (*own, limit(Axis.CAPTURE, [Capture.SEPARATE],
                            "separate CUDA graphs need Generator.philox_state (torch >= 2.14) for a hook's rewind: "
                            "host values are relative to the capturing graph, and a hook cannot stash outputs"))

    def supports(self, case: Case) -> str | None:
        return self.limit(case)

    def limit(self, case: Case) -> str | None:
        """What it declares (`declared_limits`), where torch_remat imports."""
        return super().supports(case)


def make_remat() -> RematAdapter:
    return RematAdapter()


def make_readme_hook() -> RematAdapter:
    return ReadmeHookAdapter()


def make_hook() -> RematAdapter:
    return HookAdapter()
