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

As with Megatron-core, the harness holds a `TrackerView` (names and value snapshots for its own
bookkeeping); TE never sees the view.

Declared unsupported: every case when ``transformer_engine.pytorch`` does not import (`unavailable`,
with the error), the cpu device (TE's tracker and checkpoint are CUDA-only), and the shared layout
(TE's tracker has no aliases: a second name for one stream would live only in the harness's view,
so the case would test the harness's own alias bookkeeping, not TE).  Capture cases run for real.

On a torch whose ``CUDAGraph.register_generator_state`` is a deprecated no-op (>= 2.14: the
environment's ``rng_apis`` says so), torch registers the tracker's generators itself on their first
use in a capture.  The harness's executors still call the method for each generator of each graph,
as the graph runners of Megatron and TE do, keep its warnings out of the log and record their count
per case (the observed fact ``capture.register_warnings``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

from ..model import ops
from ..model.cases import Case, Device, Layout
from .base import Adapter
from .packages import LazyModule, PackageAdapter, TrackerView, no_aliases_reason

DISTRIBUTED_MODULE = "transformer_engine.pytorch.distributed"
DISTRIBUTIONS = ("transformer-engine", "transformer-engine-torch")

_DISTRIBUTED = LazyModule(DISTRIBUTED_MODULE)


class TransformerEngineAdapter(PackageAdapter):
    name = "transformer-engine"
    description = "transformer_engine.pytorch checkpoint(get_rng_state_tracker=...) with its CudaRNGStatesTracker"
    tracker_kind = "transformer_engine CudaRNGStatesTracker"  # whose references are shared (`run.references`)
    devices: tuple[str, ...] = (Device.CUDA.value,)  # tests with a CPU stand-in widen this

    # the module under test: transformer_engine.pytorch.distributed
    package, distributions, top_module = "TransformerEngine", DISTRIBUTIONS, "transformer_engine"

    @staticmethod
    def lazy() -> LazyModule:
        return _DISTRIBUTED

    def supports(self, case: Case) -> str | None:
        """None for cuda cases outside the shared layout (when TE imports), else the reason."""
        reason = self.unavailable()
        if reason is not None:
            return reason
        if case.device.value not in self.devices:
            return (f"TransformerEngine's CudaRNGStatesTracker and checkpoint are CUDA-only; "
                    f"no {case.device.value} path")
        if case.layout is Layout.SHARED:
            return no_aliases_reason("TransformerEngine's CudaRNGStatesTracker")
        if case.capture.value == "eager" or "cudnn" not in attention_backends(case):
            return None  # (the process's maps are read only for the cells they can decide)
        copies = loaded_cudnn_copies()
        if len(copies) > 1:
            return (f"this process holds {len(copies)} cuDNN libraries ({', '.join(copies)}): TransformerEngine "
                    "loads the system's (RTLD_GLOBAL, before any Python package's) beside the one torch "
                    "uses, and cuDNN attention under CUDA-graph capture is then not sound (illegal memory "
                    "accesses that move from cell to cell between runs, H100 and H200, TE 2.20.2: "
                    "findings/te-second-cudnn.md)")
        return None

    def make_tracker(self, device: Any) -> TrackerView:
        return TrackerView(self.module().CudaRNGStatesTracker(), device)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any,
                   **region_kwargs: Any) -> Any:
        distributed = self.module()
        # te.checkpoint pops its own keywords and passes the rest to the region.
        kwargs: dict[str, Any] = {**region_kwargs, "use_reentrant": reentrant}
        if tracker is not None:
            real = getattr(tracker, "real", tracker)
            kwargs["get_rng_state_tracker"] = lambda: real
        return distributed.checkpoint(fn, *args, **kwargs)


_CUDNN_CORE = re.compile(r"/libcudnn\.so\.\d+(\.\d+)*$")


def loaded_cudnn_copies(maps: str = "/proc/self/maps") -> list[str]:
    """The distinct cuDNN core libraries (``libcudnn.so.N``, by the path the kernel maps) in this
    process, read from `maps` (Linux); empty where it cannot be read."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            fields = [line.split(None, 5) for line in lines]  # address perms offset dev inode [path]
    except OSError:
        return []
    paths = {field[5].strip() for field in fields if len(field) == 6}
    return sorted({path for path in paths if _CUDNN_CORE.search(path)})


def attention_backends(case: Case) -> set[str]:
    """The attention backends the case's sites run on: an explicit backend op's own, and for an
    ``sdpa_auto`` site what torch picks on this CUDA device (`ops.auto_backend`; unknown: cuDNN
    and the others, the cautious answer)."""
    out: set[str] = set()
    for site in case.program.sites():
        name = site.op.value
        if name.startswith("sdpa_") and name != "sdpa_auto":
            out.add(name.removeprefix("sdpa_"))
        elif name == "sdpa_auto" and case.device.value == "cuda":
            picked = ops.auto_backend(site.dtype, case.shape) if torch.cuda.is_available() else None
            out |= {picked} if picked else {"cudnn", "flash", "efficient", "math"}
    return out


def make_transformer_engine() -> Adapter:
    return TransformerEngineAdapter()
