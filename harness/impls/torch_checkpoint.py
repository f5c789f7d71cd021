"""`torch`: `torch.utils.checkpoint.checkpoint` with the bundled tracker, and torch's other doors.

It saves the CPU generator and the default generators of its tensor arguments' devices, by value;
tracker streams are separate generator objects it never sees, so tracked layouts are expected to
fail (a true finding, recorded in cases/expectations.toml).

The same checkpoint reached the ways users reach it (issue 24), each following the case's mode:

* ``torch-checkpoint-wrapper``: ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``
  around a module that runs the region (``CheckpointImpl.REENTRANT`` or ``NO_REENTRANT``), called
  with the region's arguments and keywords, as FSDP and torchtitan use it.  In reentrant mode it
  packs keywords into positional arguments (so a keyword input works there, unlike plain torch);
  in non-reentrant mode it hands them to ``checkpoint`` as keywords.
* ``torch-decorator``: ``checkpoint(use_reentrant=...)(fn)(*args, **kwargs)``, the decorator form
  (pytorch/pytorch#189411); unavailable on a torch whose ``checkpoint`` needs its function.
* ``torch-partial``: transformers' ``GradientCheckpointingLayer`` style,
  ``checkpoint(functools.partial(fn, **kwargs), *args)``: keyword inputs are bound into the
  function, so checkpoint never sees them (a keyword input is a closure input here).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..model.cases import Mode
from .base import Adapter
from .limits import Axis, Limit, declared, limit


class TorchAdapter(Adapter):
    name = "torch"
    must_support_all = True  # every valid case of its device: unsupported would be a failure
    description = "torch.utils.checkpoint.checkpoint(preserve_rng_state=True)"

    @property
    def version(self) -> str | None:
        return torch.__version__

    def options(self) -> dict[str, Any]:
        """Further keywords for ``torch.utils.checkpoint.checkpoint`` (selective checkpointing
        passes its ``context_fn`` here)."""
        return {}

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        with quiet_nested_reentrant():
            return torch.utils.checkpoint.checkpoint(
                fn, *args, use_reentrant=reentrant, preserve_rng_state=True, **self.options(), **kwargs
            )


@contextlib.contextmanager
def quiet_nested_reentrant() -> Any:
    """torch's "None of the inputs have requires_grad" warning kept out where it is expected."""
    with warnings.catch_warnings():
        if not torch.is_grad_enabled():
            # A nested reentrant region runs inside its parent's no-grad forward, where torch
            # warns that no input requires grad; the parent's recompute runs it again with grad.
            # With grad enabled the warning is real (it explains the error that follows): shown.
            warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
        yield


class _Region(torch.nn.Module):
    """A module whose forward is the region, for ``checkpoint_wrapper`` (which wraps modules)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class CheckpointWrapperAdapter(TorchAdapter):
    """``checkpoint_wrapper(module, checkpoint_impl=REENTRANT or NO_REENTRANT)(*args, **kwargs)``."""

    name = "torch-checkpoint-wrapper"
    must_support_all = False
    description = ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper (CheckpointImpl by mode) "
                   "around a module running the region")

    @staticmethod
    def _wrapper() -> Any:
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper

        return checkpoint_wrapper

    def unavailable(self) -> str | None:
        """None where this torch has ``checkpoint_wrapper``, else the import error."""
        try:
            self._wrapper()
        except Exception as exc:  # a torch built without distributed raises on import
            return f"this torch has no checkpoint_wrapper: {type(exc).__name__}: {exc}"
        return None

    def supports(self, case: Any) -> str | None:
        return self.unavailable()

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        module = self._wrapper()
        impl = module.CheckpointImpl.REENTRANT if reentrant else module.CheckpointImpl.NO_REENTRANT
        wrapped = module.checkpoint_wrapper(_Region(fn), checkpoint_impl=impl)
        with quiet_nested_reentrant():
            return wrapped(*args, **kwargs)


@functools.lru_cache(maxsize=None)  # supports() asks per case; the answer is the torch's, once
def _decorator_form() -> str | None:
    """None where ``checkpoint(use_reentrant=...)`` without a function returns a decorator, else why not."""
    try:
        decorator = torch.utils.checkpoint.checkpoint(use_reentrant=False)
    except TypeError as exc:
        return f"this torch's checkpoint has no decorator form (checkpoint(use_reentrant=False) raised: {exc})"
    return None if callable(decorator) else "checkpoint(use_reentrant=False) did not return a decorator"


class DecoratorAdapter(TorchAdapter):
    """``torch.utils.checkpoint.checkpoint(use_reentrant=..., preserve_rng_state=True)(fn)(*args, **kwargs)``."""

    name = "torch-decorator"
    must_support_all = False
    description = "torch.utils.checkpoint.checkpoint(use_reentrant=...)(fn), the decorator form"

    def unavailable(self) -> str | None:
        return _decorator_form()

    def supports(self, case: Any) -> str | None:
        return self.unavailable()

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        decorated = torch.utils.checkpoint.checkpoint(use_reentrant=reentrant, preserve_rng_state=True)(fn)
        with quiet_nested_reentrant():
            return decorated(*args, **kwargs)


class PartialAdapter(TorchAdapter):
    """``checkpoint(functools.partial(fn, **kwargs), *args)``, as transformers' layers call it."""

    name = "torch-partial"
    must_support_all = False
    description = ("torch.utils.checkpoint.checkpoint(functools.partial(fn, **kwargs), *args), "
                   "transformers' GradientCheckpointingLayer calling convention")

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        bound = functools.partial(fn, **kwargs) if kwargs else fn
        with quiet_nested_reentrant():
            return torch.utils.checkpoint.checkpoint(bound, *args, use_reentrant=reentrant, preserve_rng_state=True)


def _composable() -> Any:
    """torch's composable ``checkpoint(module)`` (``torch.distributed._composable``), or None
    where this torch lacks it."""
    try:
        from torch.distributed._composable import checkpoint as composable
    except (ImportError, AttributeError, RuntimeError):
        return None
    return composable


class ComposableAdapter(TorchAdapter):
    """``torch.distributed._composable.checkpoint(module)``: forward hooks that run the module's
    forward under torch's non-reentrant checkpoint (its default ``preserve_rng_state=True``),
    around a module running the region; called with the region's arguments and keywords."""

    name = "torch-composable"
    must_support_all = False
    description = "torch.distributed._composable.checkpoint(module): torch's non-reentrant checkpoint as module hooks"

    def unavailable(self) -> str | None:
        return None if _composable() else "this torch has no torch.distributed._composable.checkpoint"

    def declared_limits(self) -> tuple[Limit, ...]:
        """No reentrant form."""
        return (limit(Axis.MODE, [Mode.REENTRANT],
                      "composable checkpoint is non-reentrant only (torch raises for use_reentrant=True)"),)

    def supports(self, case: Any) -> str | None:
        return self.unavailable() or declared(self.declared_limits(), case)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        module = _Region(fn)
        _composable()(module)
        return module(*args, **kwargs)


def make_torch() -> Adapter:
    return TorchAdapter()


def make_checkpoint_wrapper() -> Adapter:
    return CheckpointWrapperAdapter()


def make_decorator() -> Adapter:
    return DecoratorAdapter()


def make_partial() -> Adapter:
    return PartialAdapter()


def make_composable() -> Adapter:
    return ComposableAdapter()
