"""`accelerate-fsdp2` and `accelerate-fsdp2-offload`: the activation checkpointing accelerate's
FSDP2 path applies (issue 39), through accelerate's own ``fsdp2_apply_ac``.

``accelerate.utils.fsdp_utils.fsdp2_apply_ac(accelerator, model)`` walks the model's children
bottom-up and replaces every layer its auto-wrap policy picks with
``checkpoint_wrapper(layer, preserve_rng_state=False)`` (accelerate >= 1.8, PR #3585), wrapped in
``offload_wrapper`` (``save_on_cpu``) when the plugin's ``activation_checkpointing_offload`` is set.
Here each region call builds a model holding one layer that runs the region (a `Layer`, named in
the plugin's ``transformer_cls_names_to_wrap``), lets ``fsdp2_apply_ac`` wrap it, and calls the
wrapped layer with the region's arguments and keywords.  The accelerator passed is a stand-in that
carries the plugin (``accelerator.state.fsdp_plugin``: all ``fsdp2_apply_ac`` reads): a real
``Accelerator`` with FSDP2 needs a process group and shards the model, which changes nothing the
checkpoint does with randomness.  The plugin is accelerate's own ``FullyShardedDataParallelPlugin``.

``checkpoint_wrapper``'s default is torch's non-reentrant checkpoint, so reentrant cases are
declared unsupported.  With ``preserve_rng_state=False`` nothing is saved or restored: every draw
of the recompute comes from wherever the generators are (cases/expectations.toml says so).
Unavailable, with the reason, where accelerate does not import or has no ``fsdp2_apply_ac``.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch

from ..model.cases import Capture, Mode
from .base import Adapter
from .limits import Axis, Limit, declared, limit
from .torch_checkpoint import _Region


class Layer(_Region):
    """The layer ``fsdp2_apply_ac`` wraps (the plugin names its class to wrap): its forward is the
    region, as for ``checkpoint_wrapper``."""


class _Model(torch.nn.Module):
    """A model whose one child is the region's layer (``fsdp2_apply_ac`` wraps children, never
    the model itself)."""

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.layer = layer


def _fsdp_utils() -> Any:
    from accelerate.utils import fsdp_utils

    return fsdp_utils


class AccelerateFSDP2Adapter(Adapter):
    """Regions wrapped by accelerate's ``fsdp2_apply_ac`` (``checkpoint_wrapper(...,
    preserve_rng_state=False)``, with ``offload_wrapper`` where `offload`)."""

    name = "accelerate-fsdp2"
    description = ("accelerate's fsdp2_apply_ac: checkpoint_wrapper(layer, preserve_rng_state=False) around "
                   "each auto-wrapped layer (a layer running the region)")
    offload = False

    def __init__(self) -> None:
        self._plugin: Any = None

    @property
    def version(self) -> str | None:
        try:
            import accelerate
        except Exception:
            return None
        return getattr(accelerate, "__version__", None)

    def unavailable(self) -> str | None:
        """None where accelerate imports and has ``fsdp2_apply_ac``, else why not."""
        try:
            utils = _fsdp_utils()
        except Exception as exc:
            return f"accelerate does not import (accelerate.utils.fsdp_utils): {type(exc).__name__}: {exc}"
        if not hasattr(utils, "fsdp2_apply_ac"):
            return "this accelerate has no accelerate.utils.fsdp_utils.fsdp2_apply_ac (FSDP2 activation checkpointing)"
        return None

    def declared_limits(self) -> tuple[Limit, ...]:
        """No reentrant form; with offloading, no CUDA-graph capture."""
        limits = [limit(Axis.MODE, [Mode.REENTRANT], "fsdp2_apply_ac uses checkpoint_wrapper's default, torch's "
                        "non-reentrant checkpoint: no reentrant path")]
        if self.offload:
            # seen on the H200 (torch 2.11): cudaErrorStreamCaptureInvalidated in every capture case
            limits.append(limit(Axis.CAPTURE, [Capture.SEPARATE, Capture.SINGLE],
                                "offload_wrapper (save_on_cpu) copies saved activations to pinned host memory, "
                                "which a CUDA graph capture cannot record"))
        return tuple(limits)

    def supports(self, case: Any) -> str | None:
        return self.unavailable() or declared(self.declared_limits(), case)

    def plugin(self) -> Any:
        """accelerate's FSDP2 plugin as a user configures activation checkpointing with it (built once)."""
        if self._plugin is None:
            from accelerate.utils import FullyShardedDataParallelPlugin

            self._plugin = FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                transformer_cls_names_to_wrap=[Layer.__name__], activation_checkpointing=True,
                activation_checkpointing_offload=self.offload)
        return self._plugin

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        model = _Model(Layer(fn))
        accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=self.plugin()))
        _fsdp_utils().fsdp2_apply_ac(accelerator, model)
        if isinstance(model.layer, Layer):  # the policy must have picked it: else nothing is checkpointed
            raise RuntimeError("fsdp2_apply_ac wrapped no layer: the auto-wrap policy did not pick the region's layer")
        return model.layer(*args, **kwargs)


class AccelerateFSDP2OffloadAdapter(AccelerateFSDP2Adapter):
    """The same with ``activation_checkpointing_offload=True`` (``offload_wrapper``: ``save_on_cpu``
    around the checkpoint)."""

    name = "accelerate-fsdp2-offload"
    description = ("accelerate's fsdp2_apply_ac with activation_checkpointing_offload: offload_wrapper("
                   "checkpoint_wrapper(layer, preserve_rng_state=False))")
    offload = True


def make_fsdp2() -> Adapter:
    return AccelerateFSDP2Adapter()


def make_fsdp2_offload() -> Adapter:
    return AccelerateFSDP2OffloadAdapter()
