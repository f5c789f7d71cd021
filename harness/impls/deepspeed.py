"""`deepspeed`: DeepSpeed's activation checkpoint and its `CudaRNGStatesTracker`.

Drives the real code of ``deepspeed.runtime.activation_checkpointing.checkpointing`` (the module
``deepspeed.checkpointing`` names), in DeepSpeed's default configuration (``configure()`` is never
called: no activation partitioning, no CPU checkpointing, no contiguous buffers, no mpu):

* the tracker is DeepSpeed's global ``CudaRNGStatesTracker`` (``get_cuda_rng_tracker()``), emptied
  with its own ``reset()`` for every run of every case, so no stream (and no used seed: ``add``
  refuses a seed twice) leaks from one case or run into the next.  Streams are added with the
  harness's own seeds (``add(name, seed)``), not through ``model_parallel_cuda_manual_seed``, which
  needs an mpu.  The tracker keeps value ByteTensors (``get_accelerator().get_rng_state()``) that
  every fork replaces;
* reentrant mode is ``checkpoint(fn, *args, **kwargs)`` (``CheckpointFunction``, an
  autograd.Function; keywords are folded into its positional arguments, so a tensor passed by
  keyword is differentiated like a positional one); non-reentrant mode is
  ``non_reentrant_checkpoint(fn, *args)`` (saved-tensor hooks, recompute in the first unpack).
  Both snapshot, at the call, the CPU generator, the *current* accelerator device's generator
  (``get_accelerator().get_rng_state()``) and the tracker's states (``get_states()``, a shallow
  copy of the dict of values); the recompute saves the then-current three, sets the forward's,
  runs the region and puts the then-current ones back.  Both read and write the *global* tracker.

What the harness holds is a `TrackerView` of that global tracker (names, value snapshots and
in-place writes for its own bookkeeping); DeepSpeed's checkpoint never sees the view.

Devices: DeepSpeed runs on one accelerator per process (``get_accelerator()``: ``cuda`` on a GPU
machine, ``cpu`` where none is found or with ``DS_ACCELERATOR=cpu``).  On the CPU accelerator its
"cuda" RNG state and its tracker streams are the CPU generator, so the checkpoint and the tracker
genuinely run on the cpu device.  A case runs only on the device of DeepSpeed's accelerator: on a
cuda accelerator the tracker forks cuda state, so cpu sites would have no tracked stream.

Declared unsupported (`supports`): every case when the module does not import (`unavailable`, with
the error), a device other than DeepSpeed's accelerator's (every case where ``get_accelerator()``
raises, e.g. for a bad ``DS_ACCELERATOR``), the shared layout (the tracker has no
aliases: a second name for one stream would live only in the harness's view, so the case would
test the harness's own alias bookkeeping, not DeepSpeed), and non-reentrant programs with a
region entered by keyword (``non_reentrant_checkpoint(function, *args)`` takes no keywords).
Everything else runs for real, including what DeepSpeed gets wrong or cannot do: inputs inside a
list or dict in reentrant mode (``CheckpointFunction`` treats a container as a non-tensor
argument), regions entered under autocast or ``sdpa_kernel`` (the recompute re-enters neither),
and CUDA-graph capture (DeepSpeed has no graph-safe path: finding what it does there is the point).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .. import rank_context
from ..model.cases import Case, Layout, Mode, Passing
from .base import Adapter
from .packages import LazyModule, PackageAdapter, TrackerView, no_aliases_reason
from .ranked import entered_after_rank_draw, no_group_reason, uncapturable_gather_reason

CHECKPOINTING_MODULE = "deepspeed.runtime.activation_checkpointing.checkpointing"
DISTRIBUTION = "deepspeed"
TRACKER = "DeepSpeed's CudaRNGStatesTracker"

_CHECKPOINTING = LazyModule(CHECKPOINTING_MODULE)


class DeepSpeedAdapter(PackageAdapter):
    """DeepSpeed's ``checkpoint`` / ``non_reentrant_checkpoint`` with its global tracker."""

    name = "deepspeed"
    description = ("deepspeed.checkpointing.checkpoint (reentrant) and non_reentrant_checkpoint "
                   "with DeepSpeed's global CudaRNGStatesTracker")
    tracker_kind = "deepspeed CudaRNGStatesTracker"  # whose references are shared (`run.references`)

    # -- the module under test: deepspeed.runtime.activation_checkpointing.checkpointing (the
    # version from metadata first: importing DeepSpeed pulls in much of its runtime)

    package, distributions, top_module = "deepspeed", (DISTRIBUTION,), "deepspeed"

    @staticmethod
    def lazy() -> LazyModule:
        return _CHECKPOINTING

    def accelerator_device(self) -> str:
        """The device type of DeepSpeed's accelerator in this process (``cuda``, ``cpu``, ...)."""
        return torch.device(self.module().get_accelerator().device_name()).type

    # -- the adapter interface

    def supports(self, case: Case) -> str | None:
        """None for cases on the accelerator's device outside the shared layout (keywords only in
        reentrant mode), when DeepSpeed imports; else the reason."""
        reason = self.unavailable()
        if reason is not None:
            return reason
        try:
            accelerator = self.accelerator_device()
        except Exception as exc:  # e.g. DS_ACCELERATOR naming an accelerator this machine lacks
            return f"DeepSpeed's get_accelerator() failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if case.device.value != accelerator:
            return (f"DeepSpeed's accelerator here is {accelerator!r}: its checkpoint saves and its "
                    f"{TRACKER} forks {accelerator} RNG state; no {case.device.value} path "
                    "(one accelerator per process, chosen by DS_ACCELERATOR or detection)")
        if case.layout is Layout.SHARED:
            return no_aliases_reason(TRACKER)
        if case.mode is Mode.NONREENTRANT:
            if not hasattr(self.module(), "non_reentrant_checkpoint"):
                return "this deepspeed has no non_reentrant_checkpoint"
            if Passing.KEYWORD in case.program.passings():
                return ("deepspeed non_reentrant_checkpoint(function, *args) passes no keyword "
                        "arguments to the region")
        return None

    def make_tracker(self, device: Any) -> TrackerView:
        """A view of DeepSpeed's global tracker, emptied (streams and used seeds) by its reset()."""
        tracker = self.module().get_cuda_rng_tracker()
        tracker.reset()
        return TrackerView(tracker, device)

    def _global_tracker_for(self, checkpointing: Any, tracker: Any) -> None:
        """Make sure DeepSpeed's global tracker is the one this run uses (empty where it has none)."""
        live = checkpointing.get_cuda_rng_tracker()
        if tracker is None:
            # The untracked layout builds no tracker, but DeepSpeed's checkpoint always snapshots
            # and restores the global one: it must not carry a previous case's streams.
            if live.get_states():
                live.reset()
            return
        if live is not getattr(tracker, "real", tracker):
            raise RuntimeError(
                "DeepSpeed's global RNG tracker is not the tracker this run built "
                "(something replaced get_cuda_rng_tracker()'s object between make_tracker and checkpoint)"
            )

    def _configure(self, checkpointing: Any) -> None:
        """DeepSpeed's default configuration (no partitioning), put back where a partitioning
        adapter in this process configured its module-level settings (`_configure_defaults`,
        DeepSpeed's own reset)."""
        if getattr(checkpointing, "PARTITION_ACTIVATIONS", False):
            checkpointing._configure_defaults()

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        checkpointing = self.module()
        self._global_tracker_for(checkpointing, tracker)
        self._configure(checkpointing)
        if reentrant:
            # DeepSpeed folds keywords into CheckpointFunction's positional arguments itself.
            return checkpointing.checkpoint(fn, *args, **kwargs)
        if kwargs:
            raise TypeError("deepspeed non_reentrant_checkpoint takes no keyword arguments for the region")
        return checkpointing.non_reentrant_checkpoint(fn, *args)


class _TensorParallelGroup:
    """The mpu DeepSpeed's ``configure`` asks for: this rank's tensor-parallel group of the
    `--ranks` layout (`rank_context`: the ranks sharing its CP and DP places)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        place = rank_context.current()
        self.rank, self.size = place.tp_rank, place.tp
        if place.tp == place.world:
            self.group = dist.group.WORLD
            return
        # every rank creates every group, in one order (new_group is collective)
        self.group = None
        for start in range(0, place.world, place.tp):
            ranks = list(range(start, start + place.tp))
            made = dist.new_group(ranks)
            if place.rank in ranks:
                self.group = made

    def get_model_parallel_rank(self) -> int:
        return self.rank

    def get_model_parallel_world_size(self) -> int:
        return self.size

    def get_model_parallel_group(self) -> Any:
        return self.group


class DeepSpeedPartitionAdapter(DeepSpeedAdapter):
    """DeepSpeed's checkpoint configured with ``partition_activations=True`` over the
    tensor-parallel group: each rank keeps its slice of a region's saved inputs, the recompute
    all-gathers them (issue 41)."""

    name = "deepspeed-partition"
    description = ("deepspeed.checkpointing with configure(mpu, partition_activations=True): each region's saved "
                   "inputs split over the tensor-parallel group of --ranks N and all-gathered for the recompute")

    def __init__(self) -> None:
        super().__init__()
        self._mpu: _TensorParallelGroup | None = None

    def supports(self, case: Case) -> str | None:
        """As `deepspeed`, and only in a process group (`--ranks N`): there is nothing to split
        the saved inputs over in one process."""
        reason = super().supports(case)
        if reason is not None:
            return reason
        reason = no_group_reason("partition_activations") or uncapturable_gather_reason(case, "partition_activations")
        if reason is not None:
            return reason
        region = entered_after_rank_draw(case)
        if region is not None:
            return ("partition_activations gathers a region's input from every rank's slice, so it must be the "
                    "same on every rank of the tensor-parallel group (a transformer layer's input is); here a draw "
                    "from a stream seeded per rank comes before a region")
        return None

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        # Partitioning empties each tensor argument it splits (``arg.data = torch.empty([])``, to
        # free it): DeepSpeed's contract is an activation made for the call that nothing reads
        # after it, as in a transformer stack.  A clone is that tensor (autograd goes through it
        # to the program's own, which later items and the gradient oracle still read).
        def fresh(value: Any) -> Any:
            return value.clone() if torch.is_tensor(value) and value.is_floating_point() else value

        args = tuple(fresh(a) for a in args)  # keywords too: DeepSpeed folds them into its arguments
        return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker,
                                  **{k: fresh(v) for k, v in kwargs.items()})

    def _configure(self, checkpointing: Any) -> None:
        if self._mpu is None:
            import deepspeed.comm as ds_comm

            if not ds_comm.is_initialized():  # wraps the process group the rank worker made
                ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
            self._mpu = _TensorParallelGroup()
        if not getattr(checkpointing, "PARTITION_ACTIVATIONS", False) or checkpointing.mpu is not self._mpu:
            checkpointing.configure(self._mpu, partition_activations=True)


def make_deepspeed() -> Adapter:
    return DeepSpeedAdapter()


def make_deepspeed_partition() -> Adapter:
    return DeepSpeedPartitionAdapter()
