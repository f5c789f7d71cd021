"""`torchtune-ac`: torchtune's full activation checkpointing (issue 39).

torchtune 0.6.1's ``torchtune.training.activations.checkpoint_wrapper(module, ac_mode="full",
ac_style=None)`` is::

    ptd_checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=checkpoint,
                           use_reentrant=False, preserve_rng_state=False)

(``ptd_checkpoint_wrapper`` is torch's ``checkpoint_wrapper``, ``checkpoint`` torch's).  Where
torchtune imports, the adapter calls that function itself.  It rarely does outside a training
environment: ``import torchtune`` requires torchao and imports torchtune's datasets, models and
generation packages, so a plain install of its wheel fails at ``import torchao``.  Where it does not
import, the adapter is that documented configuration: torch's ``checkpoint_wrapper`` with exactly
the arguments above, and its version says so (``config:torchtune-0.6.1``), so no record passes it
off as torchtune's own code.  Non-reentrant only, as torchtune's full mode is.
"""

from __future__ import annotations

from typing import Any, Callable

from .base import Adapter
from .torch_checkpoint import _Region

TORCHTUNE_SOURCE = "0.6.1"  # the torchtune whose source the configuration follows


def _torchtune_wrapper() -> "Callable[..., Any] | None":
    """torchtune's own ``checkpoint_wrapper`` where torchtune imports, else None."""
    try:
        from torchtune.training.activations import checkpoint_wrapper
    except Exception:  # ImportError for torchao, or anything its package imports raise
        return None
    return checkpoint_wrapper


class TorchtuneAdapter(Adapter):
    """Each region as a module wrapped the way torchtune's ``ac_mode="full"`` wraps a layer."""

    name = "torchtune-ac"
    description = ("torchtune's full activation checkpointing: checkpoint_wrapper(layer, NO_REENTRANT, "
                   "use_reentrant=False, preserve_rng_state=False) (torchtune's own function where torchtune "
                   "imports, else that configuration of torch's checkpoint_wrapper)")

    @property
    def version(self) -> str | None:
        if _torchtune_wrapper() is not None:
            import torchtune

            return getattr(torchtune, "__version__", None)
        return f"config:torchtune-{TORCHTUNE_SOURCE}"

    def supports(self, case: Any) -> str | None:
        if case.mode.value == "reentrant":
            return "torchtune's full activation checkpointing is non-reentrant (CheckpointImpl.NO_REENTRANT)"
        return None

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        own = _torchtune_wrapper()
        if own is not None:
            wrapped = own(_Region(fn), "full", None)
        else:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
            from torch.utils.checkpoint import checkpoint

            wrapped = checkpoint_wrapper(_Region(fn), checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                         checkpoint_fn=checkpoint, use_reentrant=False, preserve_rng_state=False)
        return wrapped(*args, **kwargs)


def make_torchtune() -> Adapter:
    return TorchtuneAdapter()
