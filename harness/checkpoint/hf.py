"""A transformers model's own activation checkpointing, turned on through whichever API the
installed transformers has (issue 39).

transformers 5.23 deprecates ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)``
(removal in v6) in favour of ``model.activation_checkpointing_enable(activation_checkpointing_kwargs=...,
every_n_layers=1, offload=False)``.  `enable_checkpointing` calls the new method where the model
has it (``hasattr``, never a version string) and the old one where it has not, and says which it
called; `set_checkpoint_function` hands the model a checkpoint function of one's own through the
hook both call (``_set_gradient_checkpointing(gradient_checkpointing_func=...)``).  Each notes the
method on the model (`API_ATTRIBUTE`), where module mode reads it for its report (`used_api`), with
the transformers version the model's classes come from (`transformers_version`).

What the options do (transformers' ``_set_gradient_checkpointing``, 5.17 and 5.23 alike):

* ``every_n_layers=N`` checkpoints the ``GradientCheckpointingLayer``\\ s at indices 0, N, 2N, ... of
  ``model.modules()`` order, counted across the whole model (an encoder-decoder's decoder layers
  continue the encoder's count); the others keep their activations and are never recomputed;
* ``offload=True`` runs each checkpoint inside torch's ``save_on_cpu(pin_memory=True,
  device_type=...)`` (the accelerator's type, ``cpu`` where there is none): the tensors saved
  for the recompute (the layer's inputs) go to pinned host memory.  It draws no random number.
  On a machine with no accelerator, torch 2.13 cannot pin memory, so the first forward raises
  ``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend``.

Since 5.23 a ``GradientCheckpointingLayer`` checkpoints its class's ``forward`` (the function, not
``__call__``), so a recompute never calls the layer's instance ``forward``: module mode sees it
through the layer's `CHECKPOINT_FUNCTION` instead (`harness.run.module_run.ModuleSession`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

ACTIVATION_API = "activation_checkpointing_enable"  # transformers 5.23 on
GRADIENT_API = "gradient_checkpointing_enable"  # before it; deprecated in 5.23, removed in v6
HOOK_API = "_set_gradient_checkpointing"  # what both call: a checkpoint function of one's own
API_ATTRIBUTE = "harness_checkpointing_api"  # where the helpers note the method they called
CHECKPOINT_FUNCTION = "_gradient_checkpointing_func"  # what a checkpointing layer calls, per instance


def checkpointing_api(model: Any) -> str:
    """The method `enable_checkpointing` calls on `model`: `ACTIVATION_API` where it has one,
    else `GRADIENT_API`."""
    return ACTIVATION_API if hasattr(model, ACTIVATION_API) else GRADIENT_API


def enable_checkpointing(model: Any, reentrant: bool = False, every_n_layers: int = 1,
                         offload: bool = False) -> str:
    """Turn on `model`'s own activation checkpointing (torch's checkpoint with
    ``use_reentrant=reentrant``, every `every_n_layers`-th layer, offloaded to the host with
    `offload`) through `checkpointing_api`, and return the method's name (also noted on the model:
    `API_ATTRIBUTE`).  The old method is given `every_n_layers` and `offload` only when they are
    not the defaults, and a TypeError names an option it does not take."""
    api = checkpointing_api(model)
    kwargs = {"use_reentrant": reentrant}
    if api == ACTIVATION_API:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers,
                                              offload=offload)
    else:
        method = getattr(model, GRADIENT_API)
        options = {name: value for name, value, default in (("every_n_layers", every_n_layers, 1),
                                                             ("offload", offload, False)) if value != default}
        missing = [name for name in options if not _takes(method, name)]
        if missing:
            raise TypeError(f"{type(model).__name__}.{GRADIENT_API} takes no {' or '.join(missing)} (and the model has "
                            f"no {ACTIVATION_API}): this transformers cannot do that")
        method(gradient_checkpointing_kwargs=kwargs, **options)
    setattr(model, API_ATTRIBUTE, api)
    return api


def set_checkpoint_function(model: Any, function: Callable[..., Any]) -> str:
    """Turn on `model`'s own checkpointing with `function` as every layer's checkpoint (called as
    ``function(layer_forward, *args)``, torch_remat's for one) through transformers' hook
    (`HOOK_API`), and return its name (also noted on the model)."""
    getattr(model, HOOK_API)(enable=True, gradient_checkpointing_func=function)
    setattr(model, API_ATTRIBUTE, HOOK_API)
    return HOOK_API


def used_api(model: Any) -> str:
    """The method these helpers turned `model`'s checkpointing on with ('' when none did)."""
    return str(getattr(model, API_ATTRIBUTE, "") or "")


def transformers_version(model: Any) -> str:
    """The version of transformers `model` (an ``nn.Module``) or any submodule of it comes from,
    '' when none is a transformers class (or transformers was never imported)."""
    library = sys.modules.get("transformers")
    if library is None:
        return ""
    modules = model.modules() if hasattr(model, "modules") else [model]
    if any(type(m).__module__.split(".", 1)[0] == "transformers" for m in modules):
        return str(getattr(library, "__version__", "") or "")
    return ""


def _takes(method: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: let the call say
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
