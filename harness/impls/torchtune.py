"""torchtune's two ways into activation checkpointing (issues 39 and 57).

`torchtune-recipes`: what torchtune 0.6.1's recipes apply when a config sets
``enable_activation_checkpointing: True`` (105 of its 156 shipped configs):
``torchtune.training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})``,
which is torch's ``apply_activation_checkpointing`` with torch's ``checkpoint_wrapper`` and its
defaults (non-reentrant, ``preserve_rng_state=True``).  Where torchtune imports, the adapter calls
torchtune's function; elsewhere torch's ``apply_activation_checkpointing``, the function torchtune's
calls, with the same arguments (its version says so: ``config:torchtune-0.6.1``).  It checkpoints
as torch does.

`torchtune-ac`: the ``ac_mode`` branch of ``torchtune/training/activations.py``, which a recipe
takes only when ``enable_activation_checkpointing`` is False and ``ac_mode`` is set (in 0.6.1, the
development config ``dev/8B_full_experimental.yaml`` alone).
``torchtune.training.activations.checkpoint_wrapper(module, ac_mode="full", ac_style=None)`` is::

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

import torch

from ..model.cases import Mode
from .base import Adapter
from .limits import Axis, Limit, declared, limit
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
    description = ("torchtune's ac_mode='full' branch (one dev config selects it): "
                   "checkpoint_wrapper(layer, NO_REENTRANT, "
                   "use_reentrant=False, preserve_rng_state=False) (torchtune's own function where torchtune "
                   "imports, else that configuration of torch's checkpoint_wrapper)")

    @property
    def version(self) -> str | None:
        if _torchtune_wrapper() is not None:
            import torchtune

            return getattr(torchtune, "__version__", None)
        return f"config:torchtune-{TORCHTUNE_SOURCE}"

    def declared_limits(self) -> tuple[Limit, ...]:
        """No reentrant form."""
        return (limit(Axis.MODE, [Mode.REENTRANT],
                      "torchtune's full activation checkpointing is non-reentrant (CheckpointImpl.NO_REENTRANT)"),)

    def supports(self, case: Any) -> str | None:
        return declared(self.declared_limits(), case)

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


def _torchtune_set_activation_checkpointing() -> "Callable[..., Any] | None":
    """torchtune's own ``training.set_activation_checkpointing`` where torchtune imports, else None."""
    try:
        from torchtune.training import set_activation_checkpointing
    except Exception:  # ImportError for torchao, or anything its package imports raise
        return None
    return set_activation_checkpointing


class _Layer(torch.nn.Module):
    """The model a recipe checkpoints, reduced to one layer: the region as its child, which the
    wrap policy selects by type as a recipe's policy selects TransformerSelfAttentionLayer."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.layer = _Region(fn)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer(*args, **kwargs)


class TorchtuneRecipesAdapter(TorchtuneAdapter):
    """Each region as a layer of a model that ``set_activation_checkpointing`` wraps, as the recipes do."""

    name = "torchtune-recipes"
    description = ("torchtune's recipes' activation checkpointing (enable_activation_checkpointing: 105 of 156 "
                   "configs): training.set_activation_checkpointing(model, auto_wrap_policy={layer type}), torch's "
                   "apply_activation_checkpointing with checkpoint_wrapper's defaults (torchtune's own function where "
                   "torchtune imports, else torch's that it calls)")

    def declared_limits(self) -> tuple[Limit, ...]:
        """No reentrant form."""
        return (limit(Axis.MODE, [Mode.REENTRANT], "torchtune's recipes checkpoint non-reentrant "
                      "(checkpoint_wrapper's default, CheckpointImpl.NO_REENTRANT)"),)

    def supports(self, case: Any) -> str | None:
        return declared(self.declared_limits(), case)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        model = _Layer(fn)
        own = _torchtune_set_activation_checkpointing()
        if own is not None:
            own(model, auto_wrap_policy={_Region})
        else:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            apply_activation_checkpointing(model, auto_wrap_policy=ModuleWrapPolicy({_Region}))
        return model(*args, **kwargs)


def make_torchtune_recipes() -> Adapter:
    return TorchtuneRecipesAdapter()
