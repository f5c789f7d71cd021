"""External implementations (Megatron-core, TransformerEngine) and third-party adapter discovery.

Neither package can run here (both are CUDA-only; TransformerEngine cannot even be installed), so
the adapters' wiring is tested against small CPU stand-ins written to a temporary directory and put
first on sys.path: ``megatron.core.tensor_parallel.random`` and ``transformer_engine.pytorch``,
with the real function names and signatures and the real save/restore logic in CPU terms.  The
adapters are told they may run on the cpu device (`devices`), and the harness runs its CPU matrix
through them:

* import failure: the adapter is `unavailable()` and every case is `unsupported`, with the import
  error;
* the shared layout is `unsupported`: neither tracker has aliases, so the harness would only test
  its own alias bookkeeping;
* the stand-in with correct value semantics passes every case it runs: streams, the reference
  reseed and the checkpoint all go through the adapter as in a real run; Megatron's in both modes,
  non-reentrant through CheckpointWithoutOutput (output discarded, recomputed from the grad hook
  of the op after the region, which reads the refilled output back in its backward);
* the graph-safe Megatron stand-in keeps live Generator objects (as the real one does) and is
  caught in the tracked layouts in both modes; TransformerEngine's stand-in with the tracker
  ignored is caught there too, so the tracker really reaches the checkpoint;
* broken CheckpointWithoutOutput builds are caught: a recompute from fresh RNG (recompute-mask,
  gradient), a discard that hooks no recompute (an error naming it), Megatron's warm-up flag left
  set (recompute-mask alone: nothing recomputed); the passings it cannot take fail as declared;
* Megatron's global tracker is rebuilt per run with the adapter's flag, never left over from a
  previous case.

The last part checks that a third-party adapter in a temporary package is found both ways: by the
entry-point group ``harness.implementations`` and by ``module:factory``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from standin_packages import drop_modules

from harness import impls
from harness.check.compare import int_view
from harness.impls import megatron as megatron_mod
from harness.impls import transformer_engine as te_mod
from harness.impls.megatron import MegatronAdapter
from harness.impls.packages import LazyModule, TrackerView
from harness.impls.transformer_engine import TransformerEngineAdapter
from harness.model.cases import Layout, Mode, parse_case_id
from harness.model.matrix import generate
from harness.run import runner
from harness.run.runner import Outcome
from harness.run.workload import OTHER_TRACKED_STREAMS, TRACKED_STREAM

ROOT = Path(__file__).resolve().parent.parent
CPU_CASES = tuple(generate(device="cpu", program="flat,nested,siblings"))  # the first matrix
CUDA_CASE = parse_case_id("reentrant-tracked-eager-flat-none-cuda")
TRACKED_LAYOUTS = {Layout.TRACKED, Layout.MIXED}  # the shared layout is unsupported (no aliases)
NO_ALIASES = "has no aliases: the shared layout would test only the harness's own alias bookkeeping"

# --- stand-ins -----------------------------------------------------------------------------------

MEGATRON_RANDOM = '''
"""CPU stand-in for megatron.core.tensor_parallel.random (megatron-core 0.19 names and signatures).

The tracker, the global-tracker functions, CheckpointFunction and CheckpointWithoutOutput follow
the real code line for line, with the CPU generator in place of the current CUDA device's.  In
graph-safe mode the states are Generator objects that forks advance in place (the real ones are
CUDA generators swapped in with graphsafe_set_state), so get_states() hands out live objects, as
the real one does; the default generator's graph-safe "state" is a live handle too
(graphsafe_get_state() aliases the generator's state), which on the CPU is the generator itself.
The CPU generator also plays the real code's CPU slot, which is saved by value, so here the
default stream is rewound in graph-safe mode too (on CUDA it is not).

CheckpointWithoutOutput refills the discarded output as megatron-core 0.16 does (resize the
storage, copy the recomputed bytes in); 0.19 re-points the storage at the recomputed data with a
JIT-built C++ extension instead, which a test has no business compiling.

Deliberately broken builds, for the tests (the real code is the default):
RECOMPUTE_FROM_FORWARD_RNG = False makes _recompute draw from the RNG as it is at backward;
REGISTER_RECOMPUTE_HOOK = False makes discard_output_and_register_recompute free the outputs but
hook nothing.  megatron.core.transformer.cuda_graphs._IS_GRAPH_WARMUP is Megatron's own flag.
"""

import contextlib

import torch
from torch.utils.checkpoint import detach_variable

CALLS = []  # (function, details) for every call the tests care about
HAVE_TE = False  # FP8GlobalStateManager, activation_recompute_forward, fp8_autocast: undefined
RECOMPUTE_FROM_FORWARD_RNG = True
REGISTER_RECOMPUTE_HOOK = True

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
_CUDA_RNG_STATE_TRACKER = None
_CUDA_RNG_STATE_TRACKER_INITIALIZED = False
IS_CHECKPOINTING = False


class CudaRNGStatesTracker:
    def __init__(self, use_cudagraphable_rng=False, is_inference_rng_tracker=False):
        self.reset()
        self.use_cudagraphable_rng = use_cudagraphable_rng
        self.is_inference_rng_tracker = is_inference_rng_tracker

    def is_initialized(self):
        return self._is_initialized

    def reset(self):
        self._is_initialized = False
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self):
        states = {}
        for name in self.states_:
            states[name] = self.states_[name]
        return states

    def set_states(self, states):
        self._is_initialized = True
        self.states_ = states

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception("seed {} already exists".format(seed))
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception("cuda rng state {} already exists".format(name))
        gen = torch.Generator().manual_seed(seed)
        self.states_[name] = gen if self.use_cudagraphable_rng else gen.get_state()

    @contextlib.contextmanager
    def fork(self, name=_MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception("cuda rng state {} is not added".format(name))
        orig = torch.get_rng_state()
        state = self.states_[name]
        torch.set_rng_state(state.get_state() if isinstance(state, torch.Generator) else state)
        try:
            yield
        finally:
            if isinstance(state, torch.Generator):
                state.set_state(torch.get_rng_state())  # the live object advances
            else:
                self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


def initialize_rng_tracker(
    use_te_rng_tracker=False, inference_rng_tracker=False, use_cudagraphable_rng=False,
    force_reset=False,
):
    global _CUDA_RNG_STATE_TRACKER, _CUDA_RNG_STATE_TRACKER_INITIALIZED
    CALLS.append(("initialize_rng_tracker", dict(
        use_te_rng_tracker=use_te_rng_tracker, use_cudagraphable_rng=use_cudagraphable_rng,
        force_reset=force_reset)))
    if force_reset:
        _CUDA_RNG_STATE_TRACKER = None
        _CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    if _CUDA_RNG_STATE_TRACKER_INITIALIZED:
        return
    _CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker(
        use_cudagraphable_rng=use_cudagraphable_rng, is_inference_rng_tracker=inference_rng_tracker)
    _CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def get_cuda_rng_tracker(use_te_rng_tracker=False, inference_rng_tracker=False,
                         use_cudagraphable_rng=False):
    initialize_rng_tracker(use_te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng)
    return _CUDA_RNG_STATE_TRACKER


def _get_cuda_rng_state(graph_safe=False):
    if not graph_safe:
        return torch.get_rng_state()
    return torch.default_generator  # graphsafe_get_state(): a live handle, no snapshot


def _set_cuda_rng_state(new_state, graph_safe=False):
    if graph_safe:
        # graphsafe_set_state(handle) swaps in the handle's state object; a handle of the
        # generator's own state (all the stand-in keeps) leaves it where it is, as on CUDA
        return
    torch.set_rng_state(new_state)


def is_graph_safe_cuda_rng_tracker(cuda_rng_tracker):
    return bool(getattr(cuda_rng_tracker, "use_cudagraphable_rng", False))


def _get_all_rng_states():
    cpu_rng_state = torch.get_rng_state()
    cuda_rng_state = _get_cuda_rng_state(
        graph_safe=is_graph_safe_cuda_rng_tracker(get_cuda_rng_tracker()))
    cuda_rng_state_tracker = get_cuda_rng_tracker().get_states()
    return cpu_rng_state, cuda_rng_state, cuda_rng_state_tracker


def _set_all_rng_states(cpu_rng_state, cuda_rng_state, cuda_rng_state_tracker):
    torch.set_rng_state(cpu_rng_state)
    _set_cuda_rng_state(
        cuda_rng_state, graph_safe=is_graph_safe_cuda_rng_tracker(get_cuda_rng_tracker()))
    get_cuda_rng_tracker().set_states(cuda_rng_state_tracker)


@contextlib.contextmanager
def _fork_rng():
    current_states = _get_all_rng_states()
    try:
        yield
    finally:
        _set_all_rng_states(*current_states)


def _set_checkpointing():
    global IS_CHECKPOINTING
    IS_CHECKPOINTING = True


def _unset_checkpointing():
    global IS_CHECKPOINTING
    IS_CHECKPOINTING = False


def split_tensor_into_1d_equal_chunks(tensor, new_buffer=False):
    from megatron.core import parallel_state
    group = parallel_state.get_tensor_model_parallel_group()
    size = torch.numel(tensor) // group.size()
    start = size * group.rank()
    if new_buffer:
        data = torch.empty(size, dtype=tensor.dtype, device=tensor.device, requires_grad=False)
        data.copy_(tensor.view(-1)[start:start + size])
        return data
    return tensor.view(-1)[start:start + size]


def gather_split_1d_tensor(tensor):
    import os
    import torch.distributed as dist
    from megatron.core import parallel_state
    group = parallel_state.get_tensor_model_parallel_group()
    gathered = torch.empty(torch.numel(tensor) * group.size(), dtype=tensor.dtype, device=tensor.device)
    if os.environ.get("STANDIN_MEGATRON_GATHER_OWN_SLICE"):  # a broken gather: this rank's slice everywhere
        gathered.copy_(tensor.repeat(group.size()))
    else:
        dist.all_gather_into_tensor(gathered, tensor, group=group)
    return gathered


def safely_set_viewless_tensor_data(tensor, new_data_tensor):
    assert tensor._base is None, "the tensor must be viewless"
    tensor.data = new_data_tensor


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, distribute_saved_activations, *args):
        _set_checkpointing()
        ctx.run_function = run_function
        ctx.distribute_saved_activations = distribute_saved_activations
        ctx.rng_states = _get_all_rng_states()
        with torch.no_grad():
            outputs = run_function(*args)
        if distribute_saved_activations:
            ctx.input_0_shape = args[0].data.shape
            safely_set_viewless_tensor_data(args[0], split_tensor_into_1d_equal_chunks(args[0].data, new_buffer=True))
        ctx.save_for_backward(*args)
        _unset_checkpointing()
        return outputs

    @staticmethod
    def backward(ctx, *args):
        _set_checkpointing()
        inputs = ctx.saved_tensors
        if ctx.distribute_saved_activations:
            safely_set_viewless_tensor_data(inputs[0], gather_split_1d_tensor(inputs[0].data).view(ctx.input_0_shape))
        with _fork_rng():
            _set_all_rng_states(*ctx.rng_states)
            detached_inputs = detach_variable(inputs)
            with torch.enable_grad():
                outputs = ctx.run_function(*detached_inputs)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        outputs, args = zip(
            *filter(lambda x: torch.is_tensor(x[0]) and x[0].requires_grad, zip(outputs, args)))
        torch.autograd.backward(outputs, args)
        grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else inp for inp in detached_inputs)
        _unset_checkpointing()
        return (None, None) + grads


def checkpoint(function, distribute_saved_activations, *args):
    from megatron.core.transformer.cuda_graphs import is_graph_capturing, is_graph_warmup

    tracker = get_cuda_rng_tracker()
    CALLS.append(("checkpoint", dict(
        distribute_saved_activations=distribute_saved_activations, tracker=tracker,
        graphsafe=tracker.use_cudagraphable_rng, names=list(tracker.get_states()))))
    if is_graph_warmup() or is_graph_capturing():
        return function(*args)
    return CheckpointFunction.apply(function, distribute_saved_activations, *args)


class CheckpointWithoutOutputFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, checkpoint_without_output_obj, *args):
        if checkpoint_without_output_obj.fp8:
            fp8 = FP8GlobalStateManager.is_fp8_enabled()  # NameError without TE, as in the real one
            ctx.fp8 = fp8
            ctx.fp8_recipe = FP8GlobalStateManager.get_fp8_recipe() if fp8 else None
            fwd_ctx = activation_recompute_forward(activation_recompute=True, recompute_phase=False)
        else:
            ctx.fp8 = False
            ctx.fp8_recipe = None
            fwd_ctx = contextlib.nullcontext()

        with torch.no_grad(), fwd_ctx:
            outputs = run_function(*args)
        ctx.save_for_backward(*detach_variable(args))
        checkpoint_without_output_obj.ctx = ctx
        return outputs

    @staticmethod
    def backward(ctx, *args):
        inputs = ctx.inputs
        outputs = ctx.outputs
        torch.autograd.backward(outputs, args)
        ctx.outputs = None
        ctx.inputs = None
        grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else inp for inp in inputs)
        return (None, None) + grads


class CheckpointWithoutOutput(object):
    def __init__(self, fp8=False):
        self.fp8 = fp8 is not None
        self.run_function = None
        self.fwd_cpu_rng_state = None
        self.fwd_cuda_rng_state = None
        self.fwd_cuda_rng_state_tracker = None
        self.ctx = None
        self.outputs = None

    def checkpoint(self, run_function, *args):
        from megatron.core.transformer.cuda_graphs import is_graph_warmup

        if is_graph_warmup():
            return run_function(*args)

        self.run_function = run_function

        self.rng_states = _get_all_rng_states()
        tracker = get_cuda_rng_tracker()
        CALLS.append(("CheckpointWithoutOutput.checkpoint", dict(
            fp8=self.fp8, tracker=tracker, graphsafe=tracker.use_cudagraphable_rng,
            names=list(tracker.get_states()))))

        outputs = CheckpointWithoutOutputFunction.apply(run_function, self, *args)
        self.outputs = outputs
        if isinstance(self.outputs, torch.Tensor):
            self.outputs = (self.outputs,)
        return outputs

    def _recompute(self, _):
        from megatron.core.transformer.cuda_graphs import is_graph_capturing, is_graph_warmup

        if self.ctx is None or is_graph_warmup():
            return

        if not torch.autograd._is_checkpoint_valid() and not is_graph_capturing():
            raise RuntimeError(
                "Checkpointing is not compatible with .grad(), "
                "please use .backward() if possible"
            )
        CALLS.append(("CheckpointWithoutOutput._recompute", dict(
            discarded=[o.untyped_storage().nbytes() == 0 for o in self.outputs])))

        with _fork_rng():
            if RECOMPUTE_FROM_FORWARD_RNG:
                _set_all_rng_states(*self.rng_states)

            if self.fp8:
                recompute_ctx = activation_recompute_forward(
                    activation_recompute=True, recompute_phase=True
                )
                fp8_ctx = fp8_autocast(enabled=self.ctx.fp8, fp8_recipe=self.ctx.fp8_recipe)
            else:
                recompute_ctx = contextlib.nullcontext()
                fp8_ctx = contextlib.nullcontext()

            inputs = self.ctx.saved_tensors

            def detach(t):
                if isinstance(t, torch.Tensor):
                    requires_grad = t.requires_grad
                    t = t.detach()
                    t.requires_grad_(requires_grad)
                return t

            inputs = tuple(detach(t) for t in inputs)
            with torch.enable_grad(), fp8_ctx, recompute_ctx:
                outputs = self.run_function(*inputs)

        self.run_function = None
        self.rng_states = None

        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)

        # megatron-core 0.16: refill the discarded storage with a copy (0.19: share_storage)
        with torch.no_grad():
            for output, recomputation_output in zip(self.outputs, outputs):
                output_size = recomputation_output.untyped_storage().size()
                output.untyped_storage().resize_(output_size)
                output.untyped_storage().copy_(recomputation_output.untyped_storage())

        self.ctx.outputs = outputs
        self.ctx.inputs = inputs
        self.outputs = None
        self.ctx = None

    def discard_output_and_register_recompute(self, hook_tensor):
        from megatron.core.transformer.cuda_graphs import is_graph_warmup

        CALLS.append(("CheckpointWithoutOutput.discard_output_and_register_recompute", dict(
            hook_tensor=hook_tensor, requires_grad=hook_tensor.requires_grad)))
        if is_graph_warmup():
            return

        for output in self.outputs:
            output.untyped_storage().resize_(0)

        if hook_tensor.requires_grad and REGISTER_RECOMPUTE_HOOK:
            hook_tensor.register_hook(self._recompute)
'''

MEGATRON_PARALLEL_STATE = '''
"""CPU stand-in for megatron.core.parallel_state: the tensor-parallel groups only (TP fastest, as
Megatron's default order tp-cp-ep-dp-pp makes them)."""

import torch.distributed as dist

CALLS = []
_TENSOR_MODEL_PARALLEL_GROUP = None


def initialize_model_parallel(tensor_model_parallel_size=1, context_parallel_size=1, **kwargs):
    global _TENSOR_MODEL_PARALLEL_GROUP
    assert _TENSOR_MODEL_PARALLEL_GROUP is None, "tensor model parallel group is already initialized"
    CALLS.append(dict(tp=tensor_model_parallel_size, cp=context_parallel_size))
    world, rank = dist.get_world_size(), dist.get_rank()
    for start in range(0, world, tensor_model_parallel_size):
        ranks = list(range(start, start + tensor_model_parallel_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            _TENSOR_MODEL_PARALLEL_GROUP = group


def model_parallel_is_initialized():
    return _TENSOR_MODEL_PARALLEL_GROUP is not None


def get_tensor_model_parallel_group():
    assert _TENSOR_MODEL_PARALLEL_GROUP is not None, "tensor model parallel group is not initialized"
    return _TENSOR_MODEL_PARALLEL_GROUP


def get_tensor_model_parallel_world_size():
    return get_tensor_model_parallel_group().size()
'''

CUDA_GRAPHS = '''
"""CPU stand-in for megatron.core.transformer.cuda_graphs: Megatron's own capture flags."""

_IS_GRAPH_CAPTURING = False
_IS_GRAPH_WARMUP = False


def is_graph_capturing():
    return _IS_GRAPH_CAPTURING


def is_graph_warmup():
    return _IS_GRAPH_WARMUP
'''

TE_DISTRIBUTED = '''
"""CPU stand-in for transformer_engine.pytorch.distributed: checkpoint and CudaRNGStatesTracker.

Keyword interface as in TransformerEngine >= 1.x (use_reentrant, get_rng_state_tracker,
distribute_saved_activations, tp_group); the tracker in its value (non-graph-safe) form on the CPU
generator.  IGNORE_TRACKER = True makes checkpoint drop the tracker (a deliberately broken build).
"""

import contextlib

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import detach_variable

__all__ = ["checkpoint", "CudaRNGStatesTracker"]

CALLS = []
IGNORE_TRACKER = False


class CudaRNGStatesTracker:
    def __init__(self):
        self.states_ = {}
        self.seeds_ = set()

    def reset(self):
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self):
        states = {}
        for name in self.states_:
            states[name] = self.states_[name]
        return states

    def set_states(self, states):
        self.states_ = states

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


class _CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, get_rng_state_tracker, *args):
        ctx.run_function = run_function
        ctx.get_rng_state_tracker = get_rng_state_tracker
        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        if get_rng_state_tracker is not None:
            ctx.fwd_tracker = get_rng_state_tracker().get_states()
        with torch.no_grad():
            outputs = run_function(*args)
        ctx.save_for_backward(*args)
        return outputs

    @staticmethod
    def backward(ctx, *args):
        inputs = ctx.saved_tensors
        tracker = ctx.get_rng_state_tracker
        bwd_cpu = torch.get_rng_state()
        if tracker is not None:
            bwd_tracker = tracker().get_states()
        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        if tracker is not None:
            tracker().set_states(ctx.fwd_tracker)
        detached_inputs = detach_variable(inputs)
        with torch.enable_grad():
            outputs = ctx.run_function(*detached_inputs)
        torch.set_rng_state(bwd_cpu)
        if tracker is not None:
            tracker().set_states(bwd_tracker)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [(o, a) for o, a in zip(outputs, args) if torch.is_tensor(o) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        torch.autograd.backward([o for o, _ in pairs], [a for _, a in pairs])
        grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else None for inp in detached_inputs)
        return (None, None) + grads


class _TrackerRecompute:
    """Recompute context of the non-reentrant path: forward-time tracker states in, then back."""

    def __init__(self, get_rng_state_tracker, forward_states):
        self.get, self.forward_states = get_rng_state_tracker, forward_states

    def __enter__(self):
        self.backward_states = self.get().get_states()
        self.get().set_states(dict(self.forward_states))

    def __exit__(self, *exc):
        self.get().set_states(self.backward_states)
        return False


def checkpoint(function, *args, **kwargs):
    use_reentrant = kwargs.pop("use_reentrant", True)
    kwargs.pop("distribute_saved_activations", False)
    kwargs.pop("tp_group", None)
    get_rng_state_tracker = kwargs.pop("get_rng_state_tracker", None)
    CALLS.append(("checkpoint", dict(use_reentrant=use_reentrant, tracker=get_rng_state_tracker,
                                     real=get_rng_state_tracker() if get_rng_state_tracker else None)))
    if IGNORE_TRACKER:
        get_rng_state_tracker = None
    if use_reentrant:
        return _CheckpointFunction.apply(function, get_rng_state_tracker, *args)
    context_fn = torch.utils.checkpoint.noop_context_fn
    if get_rng_state_tracker is not None:
        forward_states = get_rng_state_tracker().get_states()

        def context_fn():
            return contextlib.nullcontext(), _TrackerRecompute(get_rng_state_tracker, forward_states)

    return torch.utils.checkpoint.checkpoint(
        function, *args, use_reentrant=False, preserve_rng_state=True, context_fn=context_fn)
'''

STANDINS = {
    "megatron": {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "from . import package_info\nfrom .package_info import __version__\n",
        "megatron/core/package_info.py": '__version__ = "0.18.1"\n',
        "megatron/core/tensor_parallel/__init__.py": (
            "from .random import CheckpointWithoutOutput, checkpoint, get_cuda_rng_tracker\n"),
        "megatron/core/tensor_parallel/random.py": MEGATRON_RANDOM,
        "megatron/core/parallel_state.py": MEGATRON_PARALLEL_STATE,
        "megatron/core/transformer/__init__.py": "",
        "megatron/core/transformer/cuda_graphs.py": CUDA_GRAPHS,
    },
    "transformer_engine": {
        "transformer_engine/__init__.py": '__version__ = "2.9.0.dev0+standin"\n',
        "transformer_engine/pytorch/__init__.py": "from .distributed import checkpoint, CudaRNGStatesTracker\n",
        "transformer_engine/pytorch/distributed.py": TE_DISTRIBUTED,
    },
}
BROKEN = {
    "megatron": {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "raise ImportError(\"No module named 'triton' (stand-in)\")\n",
    },
    "transformer_engine": {
        "transformer_engine/__init__.py":
            "raise OSError(\"libtransformer_engine.so: cannot open shared object file (stand-in)\")\n",
    },
}



@pytest.fixture
def install(tmp_path, monkeypatch):
    """install(top, files) puts a stand-in package first on sys.path for this test only."""
    saved: dict[str, object] = {}
    lazies = (megatron_mod._RANDOM, te_mod._DISTRIBUTED)

    def put(top: str, files: dict[str, str]) -> Path:
        root = tmp_path / f"site-{top}"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        saved.update({k: v for k, v in drop_modules(top).items() if k not in saved})
        for lazy in lazies:
            lazy.forget()
        return root

    yield put
    for top in ("megatron", "transformer_engine"):
        drop_modules(top)
    sys.modules.update(saved)  # a real package imported before this test is put back
    for lazy in lazies:
        lazy.forget()


@pytest.fixture
def megatron(install, monkeypatch):
    install("megatron", STANDINS["megatron"])
    # The stand-in's graph-safe mode keeps CPU Generators: it needs none of the CUDA graph-safe
    # APIs that a CPU build of torch lacks, so megatron-graphsafe is available with it.
    monkeypatch.setattr(megatron_mod, "graphsafe_apis_missing", lambda: [])
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    return random


@pytest.fixture
def te(install):
    install("transformer_engine", STANDINS["transformer_engine"])
    return importlib.import_module("transformer_engine.pytorch.distributed")


def _on_cpu(adapter):
    adapter.devices = ("cpu", "cuda")
    return adapter


def _program_case(mode, passing, device="cuda", op="native_dropout"):
    """A flat, untracked case whose one region takes its input by (or is entered under) `passing`."""
    return parse_case_id(f"{mode}-untracked-eager-{op}.f32.small.{passing}.flat-none-{device}")


# --- loading without the packages ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["megatron", "megatron-graphsafe", "transformer-engine"])
def test_external_impls_are_registered_and_load_without_importing_the_package(name, install):
    install("megatron", BROKEN["megatron"])
    install("transformer_engine", BROKEN["transformer_engine"])
    assert name in impls.registered()
    adapter = impls.load(name)
    assert adapter.name == name
    assert "megatron" not in sys.modules and "transformer_engine" not in sys.modules


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("megatron", "megatron-core does not import (megatron.core.tensor_parallel.random): "
                     "ImportError: No module named 'triton' (stand-in)"),
        ("megatron-graphsafe", "megatron-core does not import"),
        ("transformer-engine", "TransformerEngine does not import (transformer_engine.pytorch.distributed): "
                               "OSError: libtransformer_engine.so: cannot open shared object file"),
    ],
)
def test_when_the_package_does_not_import_every_case_is_unsupported_with_the_error(name, fragment, install):
    install("megatron", BROKEN["megatron"])
    install("transformer_engine", BROKEN["transformer_engine"])
    adapter = impls.load(name)
    assert fragment in adapter.unavailable()
    reasons = {adapter.supports(case) for case in generate()}
    assert reasons == {adapter.unavailable()}
    result = runner.run(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), adapter)
    assert result.outcome is Outcome.UNSUPPORTED and fragment in result.reason
    assert adapter.version is None  # neither importable nor installed here


def test_a_missing_package_is_unsupported_with_module_not_found(monkeypatch):
    monkeypatch.setattr(megatron_mod, "_RANDOM", LazyModule("megatron_nonexistent_pkg.random"))
    reason = MegatronAdapter().supports(CUDA_CASE)
    assert "ModuleNotFoundError: No module named 'megatron_nonexistent_pkg'" in reason
    assert MegatronAdapter().unavailable() == reason


def test_version_comes_from_the_distribution_when_it_does_not_import(install, tmp_path):
    root = install("megatron", BROKEN["megatron"])
    info = root / "megatron_core-0.17.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.17.1\n")
    adapter = impls.load("megatron")
    assert adapter.version == "0.17.1"
    assert "does not import" in adapter.supports(CUDA_CASE)


# --- Megatron-core against its stand-in ------------------------------------------------------------


def test_the_stand_in_version_wins_over_an_installed_release_it_shadows(megatron, tmp_path, monkeypatch):
    # the GPU machine of issue 59: megatron-core 0.19.2 installed (its metadata on the path),
    # the stand-in first on the path: what runs, and so what the records name, is the stand-in
    release = tmp_path / "release"
    (release / "megatron" / "core").mkdir(parents=True)
    (release / "megatron" / "core" / "__init__.py").write_text("")
    info = release / "megatron_core-0.19.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.19.2\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(release)])  # after the stand-in
    importlib.invalidate_caches()
    assert importlib.metadata.version("megatron-core") == "0.19.2"
    assert impls.load("megatron").version == "0.18.1"  # asked before any case ran


def test_megatron_version_and_supports_reasons(megatron, monkeypatch):
    plain, graphsafe = impls.load("megatron"), impls.load("megatron-graphsafe")
    assert plain.version == graphsafe.version == "0.18.1"
    for adapter in (plain, graphsafe):
        assert adapter.unavailable() is None
        assert adapter.supports(CUDA_CASE) is None
        assert adapter.supports(parse_case_id("reentrant-shared-single-nested-draws-cuda")) == (
            f"Megatron-core's CudaRNGStatesTracker {NO_ALIASES}, not the package")
        assert "CUDA-only" in adapter.supports(parse_case_id("reentrant-tracked-eager-flat-none-cpu"))
        assert adapter.supports(parse_case_id("nonreentrant-tracked-single-nested-draws-cuda")) is None
        for mode in ("reentrant", "nonreentrant"):
            assert "pass no keyword arguments" in adapter.supports(_program_case(mode, "keyword"))
        for passing, how in [("closure", "the region closes over"), ("list", "inside a list"),
                             ("dict", "inside a dict")]:
            reason = adapter.supports(_program_case("nonreentrant", passing))
            assert reason.startswith("CheckpointWithoutOutputFunction is an autograd.Function") and how in reason
        for passing, op in [("autocast", "native_dropout"), ("sdpa_kernel", "sdpa_math")]:
            # run: a recompute that does not re-enter the region's context is a finding, not a limit
            assert adapter.supports(_program_case("nonreentrant", passing, op=op)) is None
    monkeypatch.setattr(megatron_mod, "graphsafe_apis_missing", lambda: ["Generator.clone_state"])
    assert plain.unavailable() is None and plain.supports(CUDA_CASE) is None
    assert graphsafe.unavailable() == "the graph-safe tracker needs torch APIs this build lacks: Generator.clone_state"
    assert graphsafe.supports(CUDA_CASE) == graphsafe.unavailable()


@pytest.mark.parametrize("graphsafe", [False, True])
def test_megatron_make_tracker_resets_the_global_tracker_in_the_adapter_mode(megatron, graphsafe):
    adapter = MegatronAdapter(graphsafe=graphsafe)
    first = adapter.make_tracker(torch.device("cpu"))
    first.add("model-parallel", 2718)
    megatron.IS_CHECKPOINTING = True  # as a case that raised mid-checkpoint would leave it
    second = adapter.make_tracker(torch.device("cpu"))
    assert isinstance(second, TrackerView)
    assert second.real is megatron.get_cuda_rng_tracker() and second.real is not first.real
    assert second.names() == [] and second.real.use_cudagraphable_rng is graphsafe
    assert megatron.IS_CHECKPOINTING is False
    inits = [kw for fn, kw in megatron.CALLS if fn == "initialize_rng_tracker" and kw["force_reset"]]
    assert inits and all(kw["use_cudagraphable_rng"] is graphsafe and kw["use_te_rng_tracker"] is False
                         for kw in inits)


# The streams of a tracked case: the one its sites draw from and Megatron's other names.
TRACKED_NAMES = [TRACKED_STREAM, *OTHER_TRACKED_STREAMS]


def test_megatron_checkpoint_is_called_with_distribute_saved_activations_false(megatron):
    adapter = _on_cpu(impls.load("megatron"))
    result = runner.run(parse_case_id("reentrant-tracked-eager-siblings-none-cpu"), adapter)
    assert result.outcome is Outcome.PASS, result.summary()
    calls = [kw for fn, kw in megatron.CALLS if fn == "checkpoint"]
    assert len(calls) == 2 * runner.ITERATIONS  # two sibling regions per iteration
    assert all(kw["distribute_saved_activations"] is False for kw in calls)
    assert all(kw["names"] == TRACKED_NAMES for kw in calls)


# --- megatron-distribute: distribute_saved_activations=True over the TP group of --ranks N (issue 41)


def test_megatron_distribute_supports_reasons(megatron, monkeypatch):
    import torch.distributed as dist

    from harness import rank_context

    adapter = impls.load("megatron-distribute")
    assert adapter.name == "megatron-distribute" and adapter.version == "0.18.1"
    assert "it needs one (run with --ranks N)" in adapter.supports(CUDA_CASE)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(rank_context, "_current", rank_context.RankContext(1, 2))
    assert adapter.supports(CUDA_CASE) is None
    assert "CheckpointWithoutOutput (its non-reentrant path) has none" in adapter.supports(
        parse_case_id("nonreentrant-tracked-eager-flat-none-cuda"))
    for capture in ("separate", "single"):
        assert "which CUDA-graph capture forbids" in adapter.supports(
            parse_case_id(f"reentrant-tracked-{capture}-flat-none-cuda"))
    for passing, what in [("list", "a list is not"), ("dict", "a dict is not")]:
        assert what in adapter.supports(_program_case("reentrant", passing))
    assert "63 x 65 elements do not divide by TP 2" in adapter.supports(
        parse_case_id("reentrant-untracked-eager-native_dropout.f32.odd.positional.flat-none-cuda"))
    two_regions = "eager-(native_dropout)+(native_dropout)-none-cuda"
    assert adapter.supports(parse_case_id(f"reentrant-tracked-{two_regions}")).endswith("comes before region r1")
    assert adapter.supports(parse_case_id(f"reentrant-default-{two_regions}")) is None
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")  # one GPU per rank: capturable
    assert adapter.supports(parse_case_id("reentrant-tracked-single-flat-none-cuda")) is None


@pytest.mark.parametrize("backend, capture, refused", [
    ("gloo", "eager", False), ("gloo", "separate", True), ("gloo", "single", True),
    ("nccl", "single", False), (None, "single", False),  # None: no process group at all
])
def test_the_partitioning_impls_refuse_capture_only_over_gloo(monkeypatch, backend, capture, refused):
    """Both partitioning impls (megatron-distribute, deepspeed-partition) gather in the recompute:
    over gloo (ranks sharing one GPU) that cannot be captured (seen on an H100: "operation failed
    due to a previous error during capture" on both ranks), over NCCL it can."""
    import torch.distributed as dist

    from harness.impls.ranked import uncapturable_gather_reason

    monkeypatch.setattr(dist, "is_initialized", lambda: backend is not None)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    reason = uncapturable_gather_reason(parse_case_id(f"reentrant-tracked-{capture}-flat-none-cuda"), "what")
    assert (reason is not None) is refused
    if refused:
        assert reason.startswith("what all-gathers the saved input in the recompute, over the gloo process group")


CPU_DISTRIBUTE_FACTORY = """
from harness.impls.megatron import MegatronDistributeAdapter


def factory():
    adapter = MegatronDistributeAdapter()
    adapter.devices = ("cpu", "cuda")  # the stand-in runs on the CPU generator
    return adapter
"""


def test_megatron_distribute_splits_and_gathers_over_two_cpu_ranks(install, monkeypatch):
    """The adapter's process-group wiring on two CPU ranks against the stand-in (which splits and
    gathers as Megatron does): the RNG is right, the program's own input is never the one Megatron
    empties, and a gather that hands back this rank's slice everywhere is caught."""
    from harness.run.ranks import run_ranked

    root = install("megatron", STANDINS["megatron"])
    (root / "megatron_distribute_cpu.py").write_text(CPU_DISTRIBUTE_FACTORY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    cases = [parse_case_id(c) for c in ("reentrant-tracked-eager-flat-none-cpu",
                                        "reentrant-default-eager-nested-draws-cpu",
                                        "reentrant-default-eager-native_dropout.f32.small.twice.siblings-none-cpu")]
    results = [result for _, result in run_ranked("megatron_distribute_cpu:factory", cases, 2, 300.0)]
    assert [r.outcome for r in results] == [Outcome.PASS] * 3, [r.summary() for r in results]
    monkeypatch.setenv("STANDIN_MEGATRON_GATHER_OWN_SLICE", "1")
    broken = [result for _, result in run_ranked("megatron_distribute_cpu:factory", cases[:1], 2, 300.0)]
    assert broken[0].outcome is Outcome.MISMATCH and "gradient" in {m.oracle for m in broken[0].mismatches}, \
        broken[0].summary()


def test_megatron_untracked_cases_get_a_fresh_empty_global_tracker(megatron):
    graphsafe = _on_cpu(impls.load("megatron-graphsafe"))
    assert runner.run(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), graphsafe).outcome is Outcome.MISMATCH
    stale = megatron.get_cuda_rng_tracker()
    assert stale.use_cudagraphable_rng and stale.get_states()  # left behind by that case
    plain = _on_cpu(impls.load("megatron"))
    megatron.CALLS.clear()
    result = runner.run(parse_case_id("reentrant-untracked-eager-flat-none-cpu"), plain)
    assert result.outcome is Outcome.PASS, result.summary()
    calls = [kw for fn, kw in megatron.CALLS if fn == "checkpoint"]
    assert calls and all(kw["tracker"] is not stale and kw["names"] == [] and not kw["graphsafe"] for kw in calls)


def test_megatron_checkpoint_refuses_a_global_tracker_replaced_behind_its_back(megatron):
    adapter = MegatronAdapter()
    tracker = adapter.make_tracker(torch.device("cpu"))
    megatron.initialize_rng_tracker(force_reset=True)
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="not the tracker this run built"):
        adapter.checkpoint(lambda h: h * 2, x, reentrant=True, tracker=tracker)


def test_megatron_plain_tracker_passes_every_cpu_case_in_both_modes(megatron):
    adapter = _on_cpu(impls.load("megatron"))
    passed = []
    for case in CPU_CASES:
        result = runner.run(case, adapter)
        if case.layout is Layout.SHARED:
            assert result.outcome is Outcome.UNSUPPORTED and NO_ALIASES in result.reason
            continue
        assert result.outcome is Outcome.PASS, f"{case.id}: {result.summary()}"
        assert result.impl_version == "0.18.1"
        passed.append(case.mode)
    assert passed.count(Mode.REENTRANT) == passed.count(Mode.NONREENTRANT) == 24


def _without_output_calls(megatron, what):
    return [kw for fn, kw in megatron.CALLS if fn == f"CheckpointWithoutOutput.{what}"]


def test_megatron_nonreentrant_runs_checkpoint_without_output_recomputing_from_the_hook(megatron):
    """Every region goes through CheckpointWithoutOutput without FP8 and no other checkpoint; each
    forward's outputs are discarded and refilled by exactly one recompute, from the grad hook."""
    adapter = _on_cpu(impls.load("megatron"))
    result = runner.run(parse_case_id("nonreentrant-tracked-eager-siblings-draws-cpu"), adapter)
    assert result.outcome is Outcome.PASS, result.summary()
    regions = 2 * runner.ITERATIONS  # two sibling regions per iteration; the reference checkpoints none
    checkpoints = _without_output_calls(megatron, "checkpoint")
    assert len(checkpoints) == regions and not [fn for fn, _ in megatron.CALLS if fn == "checkpoint"]
    assert all(kw["fp8"] is False and kw["names"] == TRACKED_NAMES for kw in checkpoints)
    discards = _without_output_calls(megatron, "discard_output_and_register_recompute")
    assert len(discards) == regions and all(kw["requires_grad"] for kw in discards)
    recomputes = _without_output_calls(megatron, "_recompute")
    assert len(recomputes) == regions and all(kw["discarded"] == [True] for kw in recomputes)


def test_megatron_nonreentrant_nested_regions_recompute_once_per_forward_call(megatron):
    """Nested: the inner region runs in the outer forward (no grad: no hook) and again in the
    outer's recompute, whose hook recomputes it; so three checkpoints and two recomputes."""
    adapter = _on_cpu(impls.load("megatron"))
    result = runner.run(parse_case_id("nonreentrant-mixed-eager-nested-none-cpu"), adapter)
    assert result.outcome is Outcome.PASS, result.summary()
    discards = _without_output_calls(megatron, "discard_output_and_register_recompute")
    assert [kw["requires_grad"] for kw in discards] == [False, True, True] * runner.ITERATIONS
    assert len(_without_output_calls(megatron, "_recompute")) == 2 * runner.ITERATIONS


def test_megatron_checkpoint_without_output_needs_fp8_none_without_transformer_engine(megatron):
    """``fp8=False`` (the default) switches FP8 on (``self.fp8 = fp8 is not None``), which needs TE."""
    assert megatron.CheckpointWithoutOutput().fp8 is True
    assert megatron.CheckpointWithoutOutput(fp8=None).fp8 is False
    adapter = MegatronAdapter()
    tracker = adapter.make_tracker(torch.device("cpu"))
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(NameError, match="FP8GlobalStateManager"):
        megatron.CheckpointWithoutOutput().checkpoint(lambda h: h * 2, x)
    out = adapter.checkpoint(lambda h: h * 2, x, reentrant=False, tracker=tracker)
    out.sum().backward()
    assert torch.equal(out, torch.full((4,), 2.0)) and torch.equal(x.grad, torch.full((4,), 2.0))


@pytest.mark.parametrize("passing", ["closure", "list", "dict"])
def test_megatron_declared_passings_fail_as_their_reason_says_when_run_anyway(megatron, monkeypatch, passing):
    """The reason is the real code's: the region's output does not require grad, no recompute hook
    is registered, and (in a flat program, where nothing after the region needs grad) backward
    has nothing to differentiate."""
    adapter = _on_cpu(impls.load("megatron"))
    monkeypatch.setattr(adapter, "supports", lambda case: None)
    result = runner.run(_program_case("nonreentrant", passing, device="cpu"), adapter)
    assert result.outcome is Outcome.ERROR
    assert "element 0 of tensors does not require grad" in result.error
    discards = _without_output_calls(megatron, "discard_output_and_register_recompute")
    assert discards and not any(kw["requires_grad"] for kw in discards)
    assert not _without_output_calls(megatron, "_recompute")


def test_megatron_graphsafe_tracker_is_caught_where_sites_draw_from_tracker_streams(megatron):
    """The stand-in's graph-safe states are live objects, so both checkpoints restore nothing."""
    adapter = _on_cpu(impls.load("megatron-graphsafe"))
    for case in CPU_CASES:
        if case.layout is Layout.SHARED:
            continue
        result = runner.run(case, adapter)
        if case.layout in TRACKED_LAYOUTS:
            assert result.outcome is Outcome.MISMATCH, case.id
            oracles = {m.oracle for m in result.mismatches}
            assert {"recompute-mask", "gradient", "live-stream"} <= oracles, (case.id, oracles)
        else:  # the stand-in's default (CPU) stream is saved by value, unlike the CUDA one
            assert result.outcome is Outcome.PASS, f"{case.id}: {result.summary()}"


def test_megatron_recompute_with_fresh_rng_is_caught_by_recompute_mask_and_gradient(megatron):
    megatron.RECOMPUTE_FROM_FORWARD_RNG = False  # _recompute skips _set_all_rng_states
    adapter = _on_cpu(impls.load("megatron"))
    for case_id in ("nonreentrant-default-eager-flat-none-cpu", "nonreentrant-tracked-eager-nested-draws-cpu"):
        result = runner.run(parse_case_id(case_id), adapter)
        oracles = {m.oracle for m in result.mismatches}
        assert result.outcome is Outcome.MISMATCH and {"recompute-mask", "gradient"} <= oracles, case_id
        assert "live-stream" not in oracles  # _fork_rng still puts every stream back afterwards
        # the op after the region read back an output other than the forward's: NaN where it differs
        assert any(m.oracle == "gradient" and m.got.startswith("nan") for m in result.mismatches)


def test_megatron_discard_without_a_recompute_hook_is_an_error_naming_it(megatron):
    megatron.REGISTER_RECOMPUTE_HOOK = False  # the outputs are freed, nothing refills them
    adapter = _on_cpu(impls.load("megatron"))
    result = runner.run(parse_case_id("nonreentrant-default-eager-flat-none-cpu"), adapter)
    assert result.outcome is Outcome.ERROR
    assert "the region's output is still discarded" in result.error and "no recompute ran" in result.error


def test_megatron_graph_warmup_flag_left_set_skips_checkpointing_caught_by_recompute_mask_alone(megatron):
    """Under Megatron's own warm-up flag both checkpoints run the region plainly: nothing is
    recomputed, and everything else is right."""
    cuda_graphs = importlib.import_module("megatron.core.transformer.cuda_graphs")
    cuda_graphs._IS_GRAPH_WARMUP = True
    adapter = _on_cpu(impls.load("megatron"))
    for mode in ("reentrant", "nonreentrant"):
        result = runner.run(parse_case_id(f"{mode}-tracked-eager-nested-draws-cpu"), adapter)
        assert result.outcome is Outcome.MISMATCH, result.summary()
        assert {(m.oracle, m.detail) for m in result.mismatches} == {
            ("recompute-mask", "the site was never recomputed")}
    assert not _without_output_calls(megatron, "_recompute")


def test_the_op_after_the_region_passes_gradients_through_where_the_output_reads_back_unchanged():
    out = torch.tensor([1.0, -0.0, 3.0, 4.0], requires_grad=True) * 1  # a non-leaf, as a region's
    following = megatron_mod._ReadsOutputBack.apply(out)
    assert torch.equal(following, out) and following.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    grad = torch.tensor([0.5, -0.0, float("nan"), 2.0])
    (passed,) = torch.autograd.grad(following, out, grad, retain_graph=True)
    assert torch.equal(int_view(passed), int_view(grad))  # bit for bit, signed zero and NaN included
    with torch.no_grad():
        out.untyped_storage().copy_(torch.tensor([1.0, -0.0, 3.5, 4.0]).untyped_storage())  # no version bump
    (poisoned,) = torch.autograd.grad(following, out, grad.nan_to_num(), retain_graph=True)
    assert poisoned[[0, 1, 3]].tolist() == [0.5, -0.0, 2.0] and poisoned[2].isnan()
    out.untyped_storage().resize_(0)  # discarded, never refilled
    with pytest.raises(RuntimeError, match="still discarded"):
        torch.autograd.grad(following, out, grad)


# --- TransformerEngine against its stand-in --------------------------------------------------------


def test_te_version_and_supports_reasons(te):
    adapter = impls.load("transformer-engine")
    assert isinstance(adapter, TransformerEngineAdapter)
    assert adapter.version == "2.9.0.dev0+standin"
    assert adapter.unavailable() is None
    assert adapter.supports(CUDA_CASE) is None
    assert adapter.supports(parse_case_id("nonreentrant-tracked-separate-nested-draws-cuda")) is None
    assert adapter.supports(parse_case_id("nonreentrant-shared-separate-nested-draws-cuda")) == (
        f"TransformerEngine's CudaRNGStatesTracker {NO_ALIASES}, not the package")
    assert "CUDA-only" in adapter.supports(parse_case_id("reentrant-tracked-eager-flat-none-cpu"))


def test_te_declares_cudnn_attention_under_capture_unsound_where_it_loaded_a_second_cudnn(te, tmp_path,
                                                                                             monkeypatch):
    # TE 2.20.2 loads the system's libcudnn (RTLD_GLOBAL) beside torch's: cuDNN attention under
    # capture then crashes from run to run (H100, H200); the adapter says so instead of a verdict
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libcudnn.so.9.10.2\n"
        "7f01-7f02 r--p 00001000 08:01 11 /usr/lib/x86_64-linux-gnu/libcudnn.so.9.10.2\n"
        "7f02-7f03 r-xp 00000000 08:01 12 /venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f03-7f04 r-xp 00000000 08:01 13 /venv/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n")
    assert te_mod.loaded_cudnn_copies(str(maps)) == ["/usr/lib/x86_64-linux-gnu/libcudnn.so.9.10.2",
                                                     "/venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9"]
    assert te_mod.loaded_cudnn_copies(str(tmp_path / "absent")) == []
    adapter = impls.load("transformer-engine")
    captured = parse_case_id("reentrant-untracked-single-sdpa_cudnn.f16.small.sdpa_kernel.flat-none-cuda")
    eager = parse_case_id("nonreentrant-default-eager-sdpa_cudnn.f16.small.sdpa_kernel.flat-none-cuda")
    flash = parse_case_id("nonreentrant-mixed-single-sdpa_flash.f16.small.sdpa_kernel.flat-none-cuda")
    monkeypatch.setattr(te_mod, "loaded_cudnn_copies", lambda: ["/a/libcudnn.so.9", "/b/libcudnn.so.9"])
    assert "2 cuDNN libraries (/a/libcudnn.so.9, /b/libcudnn.so.9)" in adapter.supports(captured)
    assert adapter.supports(eager) is None and adapter.supports(flash) is None
    monkeypatch.setattr(te_mod, "loaded_cudnn_copies", lambda: ["/b/libcudnn.so.9"])
    assert adapter.supports(captured) is None  # one cuDNN: judged


def test_te_passes_every_cpu_case_in_both_modes_with_its_own_tracker(te):
    adapter = _on_cpu(impls.load("transformer-engine"))
    for case in CPU_CASES:
        te.CALLS.clear()
        result = runner.run(case, adapter)
        if case.layout is Layout.SHARED:
            assert result.outcome is Outcome.UNSUPPORTED and NO_ALIASES in result.reason and not te.CALLS
            continue
        assert result.outcome is Outcome.PASS, f"{case.id}: {result.summary()}"
        calls = [kw for fn, kw in te.CALLS if fn == "checkpoint"]
        assert calls and all(kw["use_reentrant"] is (case.mode is Mode.REENTRANT) for kw in calls)
        if case.layout is Layout.UNTRACKED:
            assert all(kw["tracker"] is None for kw in calls)
        else:  # TE gets its own tracker object, never the harness's view of it
            assert all(isinstance(kw["real"], te.CudaRNGStatesTracker) for kw in calls)


def test_te_that_drops_the_tracker_is_caught_in_the_tracked_layouts(te):
    te.IGNORE_TRACKER = True
    adapter = _on_cpu(impls.load("transformer-engine"))
    for case in CPU_CASES:
        if case.nesting.value != "flat" or case.interleave.value != "none":
            continue
        result = runner.run(case, adapter)
        if case.layout is Layout.SHARED:
            continue  # unsupported: checked above
        expected = Outcome.MISMATCH if case.layout in TRACKED_LAYOUTS else Outcome.PASS
        assert result.outcome is expected, f"{case.id}: {result.summary()}"


# --- TrackerView -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["megatron", "megatron-graphsafe", "transformer-engine"])
def test_the_shared_layout_is_unsupported_as_the_trackers_have_no_aliases(megatron, te, name):
    """The view keeps no aliases of its own: a shared case would test the harness, not the package."""
    adapter = _on_cpu(impls.load(name))
    view = adapter.make_tracker(torch.device("cpu"))
    assert isinstance(view, TrackerView) and not hasattr(view, "add_alias")
    for case in CPU_CASES:
        if case.layout is Layout.SHARED:
            result = runner.run(case, adapter)
            assert result.outcome is Outcome.UNSUPPORTED, case.id
            assert NO_ALIASES in result.reason and result.mismatches == []


@pytest.mark.parametrize("graphsafe", [False, True])
def test_tracker_view_is_upstreams_names_and_streams(megatron, graphsafe):
    view = MegatronAdapter(graphsafe=graphsafe).make_tracker(torch.device("cpu"))
    view.add("model-parallel", 2718)
    view.add("data-parallel", 3141)
    assert view.names() == list(view.real.get_states()) == ["model-parallel", "data-parallel"]
    with view.fork("data-parallel"):
        drawn = torch.rand(8)
    assert torch.equal(drawn, torch.rand(8, generator=torch.Generator().manual_seed(3141)))
    if graphsafe:  # the objects behind the names, for the stream inventory
        assert view.generator("data-parallel") is view.real.get_states()["data-parallel"]
        assert view.generators() == [view.generator("model-parallel"), view.generator("data-parallel")]
    else:  # plain mode keeps values that every fork replaces: no object to follow
        assert not hasattr(view, "generator") and view.generators() == []
    with pytest.raises(KeyError):
        view.set_states({"nonesuch": view.get_states()["model-parallel"]})


@pytest.mark.parametrize("graphsafe", [False, True])
def test_tracker_view_states_are_values_and_set_states_writes_in_place(megatron, graphsafe):
    view = MegatronAdapter(graphsafe=graphsafe).make_tracker(torch.device("cpu"))
    view.add("model-parallel", 2718)
    before = view.get_states()
    objects = view.generators()
    assert len(objects) == (1 if graphsafe else 0)
    with view.fork("model-parallel"):
        torch.rand(100)
    assert not torch.equal(view.get_states()["model-parallel"], before["model-parallel"])  # a value, not a handle
    view.set_states(before)
    assert torch.equal(view.get_states()["model-parallel"], before["model-parallel"])
    assert view.generators() == objects and all(a is b for a, b in zip(view.generators(), objects))
    assert view.real is megatron.get_cuda_rng_tracker()


# --- third-party adapters: entry point and module:factory ------------------------------------------

THIRD_PARTY = '''
"""A third-party adapter: torch.utils.checkpoint, declining what it cannot do."""

import torch.utils.checkpoint

from harness.impls.base import Adapter


class Theirs(Adapter):
    name = "theirs"

    @property
    def version(self):
        return "1.2.3"

    def checkpoint(self, fn, *args, reentrant, tracker):
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=reentrant)

    def supports(self, case):
        if case.layout.value in ("tracked", "mixed", "shared"):
            return "saves no tracker streams"
        return None


def factory():
    return Theirs()
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """Package `theirpkg` plus a dist-info registering it in `harness.implementations`."""
    site = tmp_path / "site"
    (site / "theirpkg").mkdir(parents=True)
    (site / "theirpkg" / "__init__.py").write_text("")
    (site / "theirpkg" / "adapter.py").write_text(textwrap.dedent(THIRD_PARTY))
    info = site / "theirpkg-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: theirpkg\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(
        f"[{impls.ENTRY_POINT_GROUP}]\ntheirs = theirpkg.adapter:factory\n"
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    for module in ("theirpkg", "theirpkg.adapter"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    yield site
    for module in ("theirpkg", "theirpkg.adapter"):
        sys.modules.pop(module, None)


def _check_theirs(adapter):
    assert type(adapter).__name__ == "Theirs" and adapter.name == "theirs"
    passing = runner.run(parse_case_id("nonreentrant-default-eager-nested-draws-cpu"), adapter)
    assert passing.outcome is Outcome.PASS and passing.impl_version == "1.2.3", passing.summary()
    declined = runner.run(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), adapter)
    assert declined.outcome is Outcome.UNSUPPORTED and declined.reason == "saves no tracker streams"


def test_third_party_adapter_is_found_through_the_entry_point_group(third_party):
    assert impls.registered()["theirs"] == "theirpkg.adapter:factory"
    _check_theirs(impls.load("theirs"))


def test_third_party_adapter_is_found_by_module_and_factory(third_party):
    _check_theirs(impls.load("theirpkg.adapter:factory"))


def test_third_party_entry_point_works_from_the_command_line(third_party, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(third_party), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--impl", "theirs", "--device", "cpu", "--program", "flat",
         "--interleave", "none", "--layout", "default,tracked", "--mode", "reentrant",
         "--report-dir", str(tmp_path / "report"), "-q", "--no-isolate"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,  # a last resort, not a speed test
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    records = [json.loads(line) for line in (tmp_path / "report" / "results.jsonl").read_text().splitlines()]
    assert {(r["layout"], r["outcome"], r["impl_version"]) for r in records} == {
        ("default", "pass", "1.2.3"), ("tracked", "unsupported", "1.2.3")
    }


@pytest.mark.parametrize("graphsafe", [False, True])
def test_megatron_says_so_when_it_gets_another_tracker_kind_than_asked(megatron, monkeypatch, graphsafe):
    # Megatron keeps the first tracker it made unless force_reset=True: an initialiser that ignores
    # the reset (as an early plain get_cuda_rng_tracker() does to a later graph-safe request) leaves
    # the other kind in place, which the adapter must refuse in one line, not run silently.
    megatron.initialize_rng_tracker(use_cudagraphable_rng=not graphsafe, force_reset=True)
    real = megatron.initialize_rng_tracker
    monkeypatch.setattr(megatron, "initialize_rng_tracker",
                        lambda *args, force_reset=False, **kwargs: real(*args, **kwargs))
    adapter = MegatronAdapter(graphsafe=graphsafe)
    with pytest.raises(RuntimeError, match="not the (graph-safe|plain).* tracker asked for"):
        adapter.make_tracker(torch.device("cpu"))
    result = runner.run(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), _on_cpu(adapter))
    assert result.outcome is Outcome.ERROR and "tracker asked for" in result.error
