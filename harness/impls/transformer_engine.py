"""`transformer-engine`: TransformerEngine's ``checkpoint`` with its ``CudaRNGStatesTracker``.

Drives the real code of ``transformer_engine.pytorch.distributed`` (``te.checkpoint`` is the same
function):

* the tracker is a fresh ``CudaRNGStatesTracker()`` per run of every case.  TE picks its mode
  itself: graph-safe (`torch.Generator` states from ``clone_state()``, swapped in with
  ``graphsafe_set_state``) wherever torch has the graph-safe generator APIs, which is every torch
  the harness supports on CUDA;
* the checkpoint is ``checkpoint(fn, *args, use_reentrant=..., get_rng_state_tracker=...)``, with
  ``get_rng_state_tracker`` returning that tracker object itself, so TE's own save/restore
  (``get_states()``/``set_states()``) is what is tested.  The untracked layout passes no tracker
  (TE's value path).  Both of TE's modes run: reentrant (``_CheckpointFunction``) and
  non-reentrant (``_CheckpointFrame`` with saved-tensor hooks).  The region is a plain function, not
  an ``nn.Module``, so TE never hands it to ``torch.utils.checkpoint``.

As with Megatron-core, the harness holds a `TrackerView` (aliases as second names of one TE stream,
value snapshots for its own bookkeeping); TE never sees the view.

Declared unsupported: every case when ``transformer_engine.pytorch`` does not import (with the
error), and the cpu device (TE's tracker and checkpoint are CUDA-only).  Capture cases run for real.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..cases import Case, Device
from .base import Adapter
from .megatron import LazyModule, TrackerView, installed_version, module_version

DISTRIBUTED_MODULE = "transformer_engine.pytorch.distributed"
DISTRIBUTIONS = ("transformer-engine", "transformer-engine-torch")

_DISTRIBUTED = LazyModule(DISTRIBUTED_MODULE)


class TransformerEngineAdapter(Adapter):
    name = "transformer-engine"
    description = "transformer_engine.pytorch checkpoint(get_rng_state_tracker=...) with its CudaRNGStatesTracker"
    devices: tuple[str, ...] = (Device.CUDA.value,)  # tests with a CPU stand-in widen this

    @staticmethod
    def module() -> Any:
        """``transformer_engine.pytorch.distributed``; ImportError (with the reason) if it does not import."""
        return _DISTRIBUTED.require()

    @property
    def import_error(self) -> str | None:
        return _DISTRIBUTED.error

    @property
    def version(self) -> str | None:
        """The installed TransformerEngine version; for a checkout on PYTHONPATH, its ``__version__``.

        Metadata first, so asking for the version does not import TransformerEngine.
        """
        found = installed_version(*DISTRIBUTIONS)
        if found is None and _DISTRIBUTED.load() is not None:
            found = module_version(sys.modules.get("transformer_engine"), ("__version__",))
        return found

    def supports(self, case: Case) -> str | None:
        error = self.import_error
        if error is not None:
            return f"TransformerEngine does not import ({DISTRIBUTED_MODULE}): {error}"
        if case.device.value not in self.devices:
            return (f"TransformerEngine's CudaRNGStatesTracker and checkpoint are CUDA-only; "
                    f"no {case.device.value} path")
        return None

    def make_tracker(self, device: Any) -> TrackerView:
        return TrackerView(self.module().CudaRNGStatesTracker(), device)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any) -> Any:
        distributed = self.module()
        kwargs: dict[str, Any] = {"use_reentrant": reentrant}
        if tracker is not None:
            real = getattr(tracker, "real", tracker)
            kwargs["get_rng_state_tracker"] = lambda: real
        return distributed.checkpoint(fn, *args, **kwargs)


def make_transformer_engine() -> Adapter:
    return TransformerEngineAdapter()
