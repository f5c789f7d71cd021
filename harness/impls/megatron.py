"""`megatron` and `megatron-graphsafe`: Megatron-core's checkpoints and its tracker.

Both adapters drive the real code of ``megatron.core.tensor_parallel.random``:

* the tracker is Megatron's global `CudaRNGStatesTracker`, rebuilt for every run of every case with
  ``initialize_rng_tracker(use_cudagraphable_rng=X, force_reset=True)`` (the first initialisation
  otherwise wins and would leak flags and streams from one case into the next);
  ``megatron`` uses the plain tracker (value ByteTensors), ``megatron-graphsafe`` the graph-safe one
  (`torch.Generator` objects from ``clone_state()``, swapped in with ``graphsafe_set_state``);
* reentrant mode is ``tensor_parallel.checkpoint(fn, False, *args)``
  (``distribute_saved_activations=False``, so no process group is needed);
* non-reentrant mode is ``CheckpointWithoutOutput``, used the way Megatron's own layers use it
  (``ckpt.checkpoint(fn, *args)``, a following op that saves the output for its backward, then
  ``ckpt.discard_output_and_register_recompute(that op's output)``: see `_checkpoint_without_output`;
  a NaN in a gradient of a non-reentrant case marks where the output that op read back in backward
  was not the forward's, bit for bit);
* both save and restore through ``_get_all_rng_states()/_set_all_rng_states()``, which read and
  write the *global* tracker through ``get_cuda_rng_tracker().get_states()/set_states()``;
* streams are added with the harness's own seeds (``add(name, seed)``), not through
  ``model_parallel_cuda_manual_seed``, so no parallel ranks are involved.

What the harness holds is a `TrackerView` of that same global tracker: it forwards `add` and
`fork`, and gives the harness value snapshots (`get_states`) and in-place writes (`set_states`) for
its own bookkeeping.  Megatron's checkpoints never see the view: they read the global tracker
directly, so what is tested is Megatron's own save/restore.

``CheckpointWithoutOutput`` is built with ``fp8=None``: its constructor sets
``self.fp8 = fp8 is not None``, so the default ``fp8=False`` turns the FP8 path *on*, which needs
TransformerEngine (``FP8GlobalStateManager``; a NameError without it).  ``None`` is the value
Megatron's own callers pass for "no FP8".  Its recompute restores the discarded output's storage:
megatron-core 0.16 resizes it and copies the recomputed bytes in; 0.19 (0.17 on, by the project's
Megatron notes) re-points it at the recomputed data with a C++ extension (``share_storage``),
JIT-built with ``torch.utils.cpp_extension.load_inline`` at the first recompute of a process (a
host C++ compiler, the ninja executable and Python headers needed; cached under
``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``, so later processes only load
it).  Build it once before a run (``.scratch/gpu_mcore.sh`` does): a first build inside a case
with a time limit can be killed half way and leave its lock file behind for every later case.

Declared unsupported (`supports`): every case when the code cannot be loaded here (`unavailable`:
megatron-core does not import, with the error; for the graph-safe tracker, a torch without the
graph-safe generator APIs), the cpu device (the tracker and checkpoints are CUDA-only), the shared
layout (Megatron's tracker has no aliases: a second name for one stream would live only in the
harness's view, so the case would test the harness's own alias bookkeeping, not Megatron), the
keyword passing (both checkpoints take ``*args`` only), and in non-reentrant mode the closure and
container passings (`_WITHOUT_OUTPUT_PASSINGS`: ``CheckpointWithoutOutputFunction`` is an
autograd.Function, blind to an input that is not a tensor argument, so the region's output does
not require grad and no recompute hook is registered).  Regions entered under autocast or an
SDPA backend run: neither checkpoint re-enters that context in its recompute, which is a finding,
not a limit.  Capture cases run for real: Megatron's checkpoints bypass themselves
only under Megatron's own graph warm-up and capture flags, which the harness's executors do not set.

The helpers here (`TrackerView`, `LazyModule`, `installed_version`) are shared with the
TransformerEngine adapter.

On a torch whose ``CUDAGraph.register_generator_state`` is a deprecated no-op (>= 2.14: the
environment's ``rng_apis`` says so), torch registers the tracker's generators itself on their first
use in a capture.  The harness's executors still call the method for each generator of each graph,
as the graph runners of Megatron and TE do, keep its warnings out of the log and record their count
per case (the observed fact ``capture.register_warnings``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .. import rank_context
from ..check.compare import int_view
from ..model.cases import Case, Device, Layout, Mode, Passing
from .base import Adapter
from .packages import (
    LazyModule,
    PackageAdapter,
    TrackerView,
    graphsafe_apis_missing,
    no_aliases_reason,
)
from .ranked import entered_after_rank_draw, no_group_reason, uncapturable_gather_reason

RANDOM_MODULE = "megatron.core.tensor_parallel.random"
DISTRIBUTION = "megatron-core"


# --- Megatron-core -------------------------------------------------------------------------------

_RANDOM = LazyModule(RANDOM_MODULE)
_PARALLEL_STATE = LazyModule("megatron.core.parallel_state")  # megatron-distribute's groups


class MegatronAdapter(PackageAdapter):
    """Megatron's checkpoints (reentrant: `tensor_parallel.checkpoint`, non-reentrant:
    `CheckpointWithoutOutput`) with its global tracker in one mode (plain or graph-safe)."""

    name = "megatron"
    description = ("megatron.core.tensor_parallel.checkpoint (reentrant) and CheckpointWithoutOutput "
                   "(non-reentrant) with the plain CudaRNGStatesTracker")
    graphsafe = False
    devices: tuple[str, ...] = (Device.CUDA.value,)  # tests with a CPU stand-in widen this

    def __init__(self, graphsafe: bool = False) -> None:
        self.graphsafe = graphsafe
        # whose references this impl's may share (`run.references`): Megatron's global tracker in one mode
        self.tracker_kind = f"megatron CudaRNGStatesTracker(use_cudagraphable_rng={graphsafe})"
        if graphsafe:
            self.name = "megatron-graphsafe"
            self.description = (
                "megatron.core.tensor_parallel.checkpoint (reentrant) and CheckpointWithoutOutput "
                "(non-reentrant) with the graph-safe CudaRNGStatesTracker (use_cudagraphable_rng=True)"
            )

    # -- the module under test: megatron.core.tensor_parallel.random (a source checkout keeps its
    # version in package_info)

    package, distributions = "megatron-core", (DISTRIBUTION,)
    top_module, version_attrs = "megatron.core", ("package_info.__version__", "__version__")

    @staticmethod
    def lazy() -> LazyModule:
        return _RANDOM

    # -- the adapter interface

    def unavailable(self) -> str | None:
        """None when megatron-core imports (and, for the graph-safe tracker, torch has the
        graph-safe generator APIs), else one line saying why not."""
        reason = super().unavailable()
        if reason is not None:
            return reason
        if self.graphsafe:
            missing = graphsafe_apis_missing()
            if missing:
                return ("the graph-safe tracker needs torch APIs this build lacks: "
                        f"{', '.join(missing)}")
        return None

    def supports(self, case: Case) -> str | None:
        """None for cuda cases outside the shared layout whose input the mode's checkpoint can
        take (when available), else why not."""
        reason = self.unavailable()
        if reason is not None:
            return reason
        if case.device.value not in self.devices:
            return (f"Megatron-core's CudaRNGStatesTracker and checkpoints are CUDA-only "
                    f"(torch.cuda RNG state, CUDA default generators); no {case.device.value} path")
        if case.layout is Layout.SHARED:
            return no_aliases_reason("Megatron-core's CudaRNGStatesTracker")
        passings = case.program.passings()
        if Passing.KEYWORD in passings:
            return ("megatron.core.tensor_parallel.checkpoint(function, distribute_saved_activations, *args) "
                    "and CheckpointWithoutOutput.checkpoint(run_function, *args) pass no keyword "
                    "arguments to the region")
        refused = sorted(passings & _WITHOUT_OUTPUT_PASSINGS.keys(), key=lambda passing: passing.value)
        if case.mode is Mode.NONREENTRANT and refused:
            return _WITHOUT_OUTPUT_PASSINGS[refused[0]]
        return None

    def _reset_global_tracker(self, random: Any) -> Any:
        """A fresh, empty global tracker in this adapter's mode; Megatron's checkpoint flag cleared."""
        random.initialize_rng_tracker(
            use_te_rng_tracker=False, inference_rng_tracker=False,
            use_cudagraphable_rng=self.graphsafe, force_reset=True,
        )
        unset = getattr(random, "_unset_checkpointing", None)
        if callable(unset):
            unset()  # a case that raised mid-checkpoint must not leave the flag set for the next
        tracker = random.get_cuda_rng_tracker(use_cudagraphable_rng=self.graphsafe)
        problem = tracker_kind_problem(tracker, self.graphsafe)
        if problem:
            raise RuntimeError(problem)
        return tracker

    def make_tracker(self, device: Any) -> TrackerView:
        random = self.module()
        return TrackerView(self._reset_global_tracker(random), device)

    def _global_tracker_for(self, random: Any, tracker: Any) -> None:
        """Make sure Megatron's global tracker is the one this run uses (fresh where it has none)."""
        live = random.get_cuda_rng_tracker(use_cudagraphable_rng=self.graphsafe)
        if tracker is None:
            # The untracked layout builds no tracker, but Megatron's checkpoint always consults the
            # global one: give it an empty one of this adapter's mode, not a previous case's.
            mode = bool(getattr(live, "use_cudagraphable_rng", False))
            if live.get_states() or mode != self.graphsafe:
                self._reset_global_tracker(random)
            return
        real = getattr(tracker, "real", tracker)
        if live is not real:
            raise RuntimeError(
                "Megatron-core's global RNG tracker is not the tracker this run built "
                "(something re-initialised it between make_tracker and checkpoint)"
            )

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        """Reentrant: ``tensor_parallel.checkpoint(fn, False, *args)``; non-reentrant:
        `_checkpoint_without_output`.  Either reads Megatron's global tracker, which must be the
        one this run built (`_global_tracker_for`)."""
        random = self.module()
        self._global_tracker_for(random, tracker)
        if kwargs:
            raise TypeError("Megatron-core's checkpoints take no keyword arguments for the region")
        if reentrant:
            return random.checkpoint(fn, False, *args)
        return _checkpoint_without_output(random, fn, args)


def tracker_kind_problem(tracker: Any, graphsafe: bool) -> str:
    """'' when Megatron's `tracker` is the kind asked for (graph-safe or plain), else one line saying
    which kind it is.  Megatron keeps the first tracker it initialises: an early plain
    ``get_cuda_rng_tracker()`` makes a later ``use_cudagraphable_rng=True`` a silent no-op unless
    ``force_reset=True`` (seen with megatron-core 0.19; the harness always resets)."""
    got = bool(getattr(tracker, "use_cudagraphable_rng", False))
    if got == graphsafe:
        return ""
    kinds = {True: "graph-safe (use_cudagraphable_rng=True)", False: "plain"}
    return (f"Megatron-core's global RNG tracker is {kinds[got]}, not the {kinds[graphsafe]} tracker asked "
            f"for: initialize_rng_tracker kept an earlier tracker (only force_reset=True replaces it)")


def _invisible_input(how: str) -> str:
    """Why CheckpointWithoutOutput cannot take an input that reaches the region `how`."""
    return (f"CheckpointWithoutOutputFunction is an autograd.Function, which sees tensor arguments "
            f"only: an input {how} is invisible to it, so the region's output does not require "
            "grad, discard_output_and_register_recompute registers no recompute hook "
            "(hook_tensor.requires_grad is False) and no gradient reaches the input")


# Non-reentrant passings CheckpointWithoutOutput cannot take, with the reason in its own code
# (seen run anyway: backward has nothing to differentiate, or the input gets no gradient and the
# region is never recomputed).
_WITHOUT_OUTPUT_PASSINGS = {
    Passing.CLOSURE: _invisible_input("the region closes over (no tensor argument at all)"),
    Passing.LIST: _invisible_input("inside a list"),
    Passing.DICT: _invisible_input("inside a dict"),
}


def _checkpoint_without_output(random: Any, fn: Callable[..., Any], args: tuple) -> torch.Tensor:
    """``fn(*args)`` through ``CheckpointWithoutOutput`` as Megatron's layers use it; returns a
    tensor with the region's output values.

    Megatron checkpoints a function, hands its output to the next op (which saves it for its own
    backward), then discards the output's storage and hooks the recompute onto the gradient of
    that next op's output, so the recompute refills the storage just before the next op's backward
    reads it.  Here the next op is `_ReadsOutputBack`: its output (a copy of the region's) is what
    the region returns, and its backward reads the refilled output, so the restore is observed.
    """
    ckpt = random.CheckpointWithoutOutput(fp8=None)  # None, not False: False switches FP8 on
    out = ckpt.checkpoint(fn, *args)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the region returned {type(out).__name__}; CheckpointWithoutOutput is run "
                        "here for regions that return one tensor")
    following = _ReadsOutputBack.apply(out)
    ckpt.discard_output_and_register_recompute(following)
    return following


def _storage_holds(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s storage is large enough for its elements (a discarded one has 0 bytes)."""
    if tensor.numel() == 0:
        return True
    last = tensor.storage_offset() + sum((n - 1) * step for n, step in zip(tensor.shape, tensor.stride()))
    return tensor.untyped_storage().nbytes() >= (last + 1) * tensor.element_size()


class _ReadsOutputBack(torch.autograd.Function):
    """The op after a ``CheckpointWithoutOutput`` region: saves the region's output for backward
    and reads it there, as the op after a Megatron region does (an FC2 reads its input to form
    its weight gradient).

    Forward returns a copy of the output (the discard frees the output's storage, not the copy's)
    and keeps a private copy of its bits.  Backward passes the gradient through unchanged where
    the output it reads back is bit for bit the forward's and makes it NaN where it is not, so an
    output the recompute restored with other values shows in the gradient oracle even where the
    region's own gradients would not show it.  An output whose storage is still discarded (no
    recompute ran before this backward) is a RuntimeError saying so: reading it would read freed
    memory.
    """

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(out)
        ctx.forward_bits = int_view(out).clone()
        return out.detach().clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        if not _storage_holds(out):
            raise RuntimeError(
                "CheckpointWithoutOutput: the region's output is still discarded when the op after "
                "it runs its backward (no recompute ran from the hook on that op's output)")
        same = int_view(out) == ctx.forward_bits
        # Always the where, never a test of `same` on the host: backward may be under capture.
        return torch.where(same, grad, torch.full_like(grad, float("nan")))


class MegatronDistributeAdapter(MegatronAdapter):
    """Megatron's reentrant checkpoint with ``distribute_saved_activations=True`` over the
    tensor-parallel group of ``--ranks N`` (issue 41): ``CheckpointFunction`` keeps this rank's
    1/TP slice of the region's first argument (``split_tensor_into_1d_equal_chunks``) and
    all-gathers it before the recompute (``gather_split_1d_tensor``), both over the group
    ``parallel_state.initialize_model_parallel`` made (Megatron's own, called once per rank with
    the layout's TP and CP sizes)."""

    name = "megatron-distribute"
    description = ("megatron.core.tensor_parallel.checkpoint(function, True, *args): distribute_saved_activations, "
                   "the region's first argument saved split over the tensor-parallel group of --ranks N "
                   "(parallel_state.initialize_model_parallel) and all-gathered for the recompute")

    def supports(self, case: Case) -> str | None:
        """As `megatron` in reentrant mode, in a process group (`--ranks N`), eagerly where the
        group is gloo, for programs whose every region takes a tensor first, the same on every rank
        of the group, that the TP size divides."""
        reason = super().supports(case)
        if reason is not None:
            return reason
        what = "distribute_saved_activations"
        if case.mode is not Mode.REENTRANT:
            return (f"{what} is an argument of tensor_parallel.checkpoint, Megatron's reentrant checkpoint; "
                    "CheckpointWithoutOutput (its non-reentrant path) has none")
        reason = no_group_reason(what) or uncapturable_gather_reason(case, what)
        if reason is not None:
            return reason
        refused = sorted(case.program.passings() & _NO_TENSOR_FIRST.keys(), key=lambda passing: passing.value)
        if refused:
            return (f"{what} splits args[0].data (CheckpointFunction.forward: Megatron passes the hidden states "
                    f"first); {_NO_TENSOR_FIRST[refused[0]]}")
        tp = rank_context.current().tp
        rows, cols = case.program.shape_dims
        if (rows * cols) % tp:
            return (f"{what} splits the region's first argument into TP equal chunks "
                    f"(split_tensor_into_1d_equal_chunks: numel // TP elements each, the rest dropped): "
                    f"{rows} x {cols} elements do not divide by TP {tp}")
        region = entered_after_rank_draw(case)
        if region is not None:
            return (f"{what} gathers a region's first argument from every rank's slice, so it must be the same "
                    "on every rank of the tensor-parallel group (a transformer layer's input is); here a draw "
                    f"from a stream seeded per rank comes before region {region}")
        return None

    def _model_parallel(self) -> Any:
        """Megatron's parallel_state with its groups made for this rank's layout (once per process)."""
        state = _PARALLEL_STATE.require()
        place = rank_context.current()
        if not state.model_parallel_is_initialized():
            state.initialize_model_parallel(tensor_model_parallel_size=place.tp, context_parallel_size=place.cp)
        size = state.get_tensor_model_parallel_world_size()
        if size != place.tp:
            raise RuntimeError(f"Megatron-core's tensor-parallel group has {size} ranks, the --ranks layout {place.tp}")
        return state

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        """``tensor_parallel.checkpoint(fn, True, *args)`` with the first argument a clone.

        Megatron replaces the first argument's data with this rank's slice after the forward
        (``safely_set_viewless_tensor_data``) and with the gathered whole before the recompute: its
        contract is an activation made for the call that nothing else reads, as a layer's hidden
        states.  A clone is that tensor (autograd goes through it to the program's own, which later
        items and the gradient oracle still read); an argument passed twice stays one tensor."""
        random = self.module()
        self._global_tracker_for(random, tracker)
        self._model_parallel()
        if kwargs or not reentrant:
            raise TypeError("megatron-distribute runs tensor_parallel.checkpoint, with positional arguments only")
        if not args or not torch.is_tensor(args[0]):
            raise TypeError("distribute_saved_activations needs a tensor as the region's first argument")
        first = args[0].clone()
        args = tuple(first if a is args[0] else a for a in args)
        return random.checkpoint(fn, True, *args)


# Passings whose region gets no tensor as its first argument, and what it gets instead (a closure
# region is no reentrant case at all: no gradient path).
_NO_TENSOR_FIRST = {
    Passing.LIST: "a list is not a tensor",
    Passing.DICT: "a dict is not a tensor",
}


def make_megatron() -> Adapter:
    return MegatronAdapter(graphsafe=False)


def make_megatron_graphsafe() -> Adapter:
    return MegatronAdapter(graphsafe=True)


def make_megatron_distribute() -> Adapter:
    return MegatronDistributeAdapter()
