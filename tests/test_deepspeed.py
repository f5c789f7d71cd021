"""The `deepspeed` adapter, against a CPU stand-in of DeepSpeed's activation checkpointing.

DeepSpeed is not installed where these tests run, so the adapter's wiring is tested against a small
stand-in written to a temporary directory and put first on sys.path (as in
`test_external_impls.py`): ``deepspeed.runtime.activation_checkpointing.checkpointing`` (which
``deepspeed.checkpointing`` names) and ``deepspeed.accelerator``, with DeepSpeed 0.19.8's names,
signatures and save/restore logic, on its CPU accelerator (where DeepSpeed's "cuda" RNG state is the
CPU generator, as in the real ``CPU_Accelerator``).  The branches the adapter never enables
(activation partitioning, CPU checkpointing, contiguous buffers, profiling) are left out.  The
harness runs its CPU matrix through the adapter:

* import failure: the adapter is `unavailable()` and every case is `unsupported`, with the error;
* the shared layout is `unsupported` (the tracker has no aliases), and so are non-reentrant
  programs with a keyword region (``non_reentrant_checkpoint(function, *args)``) and a device
  other than DeepSpeed's accelerator's;
* the correct stand-in passes every case of the first CPU matrix it runs, in both modes;
* stand-ins with a known bug (the tracker ignored; the tracker's state dict saved as a live
  object) are caught in the tracked layouts by the recompute, gradient and live-stream oracles;
* DeepSpeed's global tracker is emptied (streams and used seeds) for every run of every case.

The last test runs the real DeepSpeed on its CPU accelerator where it is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from standin_packages import drop_modules

from harness import impls
from harness.impls import deepspeed as deepspeed_mod
from harness.impls import packages as packages_mod
from harness.impls.deepspeed import DeepSpeedAdapter
from harness.impls.packages import LazyModule, TrackerView
from harness.model.cases import Layout, Mode, parse_case_id
from harness.model.matrix import generate
from harness.run import runner
from harness.run.references import REFERENCES
from harness.run.runner import Outcome

ROOT = Path(__file__).resolve().parent.parent
FACTORY = "harness.impls.deepspeed:make_deepspeed"
CPU_CASES = tuple(generate(device="cpu", program="flat,nested,siblings"))  # the first matrix
TRACKED_LAYOUTS = {Layout.TRACKED, Layout.MIXED}
NO_ALIASES = ("DeepSpeed's CudaRNGStatesTracker has no aliases: the shared layout would test only "
              "the harness's own alias bookkeeping, not the package")
CAUGHT_BY = {"recompute-mask", "gradient", "live-stream"}  # what a recompute off the stream shows

# --- the stand-in ----------------------------------------------------------------------------------

CHECKPOINTING = '''
"""CPU stand-in for deepspeed.runtime.activation_checkpointing.checkpointing (DeepSpeed 0.19.8).

The tracker, _set_cuda_rng_state, CheckpointFunction, non_reentrant_checkpoint and checkpoint follow
the real code line for line on DeepSpeed's default configuration (the partitioning, CPU
checkpointing, contiguous-buffer and profiling branches are left out: the adapter never turns them
on).  Two switches make a deliberately broken build: IGNORE_TRACKER (the checkpoints neither save nor
restore tracker states) and LIVE_STATES_DICT (get_states() hands out the tracker's own dict, not the
copy.copy the real code makes, so a fork after the snapshot changes the snapshot).
"""

import contextlib
import copy
import weakref

import torch

from deepspeed.accelerator import get_accelerator

CALLS = []  # (function, details) for every call the tests care about
IGNORE_TRACKER = False
LIVE_STATES_DICT = False

mpu = None
mp_rank = 0
mp_size = 1
mp_group = None

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"


def detach_variable(inputs, device=None):
    if isinstance(inputs, tuple):
        out = []
        for inp in inputs:
            if not isinstance(inp, torch.Tensor):
                out.append(inp)
                continue
            requires_grad = inp.requires_grad
            x = inp.to(device=device) if device is not None else inp
            x = x.detach()
            x.requires_grad = requires_grad
            out.append(x)
        return tuple(out)
    raise RuntimeError("Only tuple of tensors is supported. Got Unsupported input type: ", type(inputs).__name__)


def _set_cuda_rng_state(new_state, device=-1):
    # The "newer PyTorch" branch (no torch._C._cuda_setRNGState): no clone of the state.
    if device == -1:
        device = torch.device(get_accelerator().device_name())
    elif isinstance(device, str):
        device = torch.device(device)
    elif isinstance(device, int):
        device = torch.device(get_accelerator().device_name(), device)

    def cb():
        idx = device.index
        if idx is None:
            idx = get_accelerator().current_device()
        default_generator = get_accelerator().default_generator(idx)
        default_generator.set_state(new_state)

    get_accelerator().lazy_call(cb)


class CudaRNGStatesTracker:
    def __init__(self):
        self.states_ = {}
        self.seeds_ = set()

    def reset(self):
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self):
        return self.states_ if LIVE_STATES_DICT else copy.copy(self.states_)

    def set_states(self, states):
        self.states_ = states

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception("seed {} already exists".format(seed))
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception("cuda rng state {} already exists".format(name))
        orig_rng_state = get_accelerator().get_rng_state()
        get_accelerator().manual_seed(seed)
        self.states_[name] = get_accelerator().get_rng_state()
        _set_cuda_rng_state(orig_rng_state)

    @contextlib.contextmanager
    def fork(self, name=_MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception("cuda rng state {} is not added".format(name))
        orig_cuda_rng_state = get_accelerator().get_rng_state()
        _set_cuda_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = get_accelerator().get_rng_state()
            _set_cuda_rng_state(orig_cuda_rng_state)


_CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker():
    return _CUDA_RNG_STATE_TRACKER


def _tracker_states():
    return None if IGNORE_TRACKER else get_cuda_rng_tracker().get_states()


def _set_tracker_states(states):
    if not IGNORE_TRACKER:
        get_cuda_rng_tracker().set_states(states)


def copy_to_device(item, device, criterion_func):
    # deepspeed.runtime.utils.copy_to_device
    if criterion_func(item):
        return item.to(device)
    elif isinstance(item, list):
        return [copy_to_device(v, device, criterion_func) for v in item]
    elif isinstance(item, tuple):
        return tuple([copy_to_device(v, device, criterion_func) for v in item])
    elif isinstance(item, dict):
        return {k: copy_to_device(v, device, criterion_func) for k, v in item.items()}
    return item


def extract_tensors(all_objects):
    tensor_objects = [v for v in all_objects if torch.is_tensor(v)]
    non_tensor_objects = [v for v in all_objects if not torch.is_tensor(v)]
    tensor_flags = [torch.is_tensor(v) for v in all_objects]
    if type(all_objects) is tuple:
        return tuple(tensor_objects), tuple(non_tensor_objects), tuple(tensor_flags)
    return tensor_objects, non_tensor_objects, tensor_flags


def merge_tensors(tensor_objects, non_tensor_objects, tensor_flags):
    merged_objects = []
    tensor_idx = 0
    non_tensor_idx = 0
    for is_tensor in tensor_flags:
        if is_tensor:
            merged_objects.append(tensor_objects[tensor_idx])
            tensor_idx += 1
        else:
            merged_objects.append(non_tensor_objects[non_tensor_idx])
            non_tensor_idx += 1
    return tuple(merged_objects)


def is_activation_to_checkpoint(item):
    extra_flag = (not hasattr(item, "no_checkpointing")) or (hasattr(item, "no_checkpointing")
                                                             and item.no_checkpointing == False)  # noqa: E712
    return torch.is_tensor(item) and item.is_floating_point() and item.numel() >= mp_size and extra_flag


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, all_outputs, *args):

        def save_args_for_backward(*all_args):
            tensor_args, non_tensor_args, tensor_flags = extract_tensors(all_objects=all_args)
            ctx.deepspeed_saved_tensors = tensor_args
            ctx.non_tensor_args = non_tensor_args
            ctx.tensor_flags = tensor_flags

        ctx.run_function = run_function
        device = get_accelerator().current_device_name()
        inputs_cuda = copy_to_device(args, device=device, criterion_func=is_activation_to_checkpoint)

        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        ctx.fwd_cuda_rng_state = get_accelerator().get_rng_state()
        ctx.fwd_cuda_rng_state_tracker = _tracker_states()

        with torch.no_grad():
            outputs = run_function(*inputs_cuda)
        del inputs_cuda
        save_args_for_backward(*args)

        if torch.is_tensor(outputs):
            non_grad_outputs = [outputs] if not outputs.is_floating_point() else []
        else:
            non_grad_outputs = [o for o in outputs if torch.is_tensor(o) and not o.is_floating_point()]
        ctx.mark_non_differentiable(*non_grad_outputs)

        if torch.is_tensor(outputs):
            all_outputs += [outputs]
            return outputs
        all_outputs += outputs
        outputs, _, _ = extract_tensors(all_objects=outputs)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("Checkpointing is not compatible with .grad(), please use .backward() if possible")
        inputs = ctx.deepspeed_saved_tensors
        detached_inputs = detach_variable(inputs)
        detached_inputs = merge_tensors(tensor_objects=detached_inputs, non_tensor_objects=ctx.non_tensor_args,
                                        tensor_flags=ctx.tensor_flags)

        bwd_cpu_rng_state = torch.get_rng_state()
        bwd_cuda_rng_state = get_accelerator().get_rng_state()
        bwd_cuda_rng_state_tracker = _tracker_states()

        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        _set_cuda_rng_state(ctx.fwd_cuda_rng_state)
        _set_tracker_states(ctx.fwd_cuda_rng_state_tracker)

        with torch.enable_grad():
            outputs = ctx.run_function(*detached_inputs)

        torch.set_rng_state(bwd_cpu_rng_state)
        _set_cuda_rng_state(bwd_cuda_rng_state)
        _set_tracker_states(bwd_cuda_rng_state_tracker)

        if isinstance(outputs, torch.Tensor):
            outputs = (outputs, )
        outputs, _, _ = extract_tensors(all_objects=outputs)
        output_tensors = []
        grad_tensors = []
        for out, grad in zip(outputs, grads):
            if out.requires_grad:
                output_tensors.append(out)
                grad_tensors.append(grad)
        torch.autograd.backward(output_tensors, grad_tensors)

        ctx.deepspeed_saved_tensors = None
        ctx.non_tensor_args = None
        ctx.tensor_flags = None
        ret_list = [None, None]
        for inp in detached_inputs:
            ret_list.append(inp.grad if torch.is_tensor(inp) else None)
        return tuple(ret_list)


def non_reentrant_checkpoint(function, *args):
    CALLS.append(("non_reentrant_checkpoint", dict(
        kwargs=(), tracker=get_cuda_rng_tracker(), names=list(get_cuda_rng_tracker().get_states()))))
    deepspeed_saved_tensors = None
    non_tensor_args = None
    tensor_flags = None

    def save_args_for_backward(*all_args):
        nonlocal deepspeed_saved_tensors, non_tensor_args, tensor_flags
        tensor_args, non_tensor_args, tensor_flags = extract_tensors(all_objects=all_args)
        deepspeed_saved_tensors = tensor_args

    device = get_accelerator().current_device_name()
    inputs_cuda = copy_to_device(args, device=device, criterion_func=is_activation_to_checkpoint)

    fwd_cpu_rng_state = torch.get_rng_state()
    fwd_cuda_rng_state = get_accelerator().get_rng_state()
    fwd_cuda_rng_state_tracker = _tracker_states()

    class Holder():
        pass

    storage = weakref.WeakKeyDictionary()
    weak_holder_list = []
    leaf_tensors = []

    def checkpoint_pack(tensor_from_forward):
        res = Holder()
        weak_holder_list.append(weakref.ref(res))
        if tensor_from_forward.requires_grad and tensor_from_forward.is_leaf:
            leaf_tensors.append(tensor_from_forward)
        return res

    def checkpoint_unpack(holder_from_backward):
        nonlocal deepspeed_saved_tensors, non_tensor_args, tensor_flags
        if len(storage) == 0:
            unpack_counter = 0

            def replay_pack(tensor_from_replay):
                nonlocal unpack_counter
                unpack_counter += 1
                if weak_holder_list[unpack_counter - 1]() is None:
                    return
                detached_activations = tensor_from_replay.detach()
                storage[weak_holder_list[unpack_counter - 1]()] = detached_activations
                return

            def replay_unpack(none_value):
                raise RuntimeError("You are calling backwards on a tensor that is never exposed.")

            if not torch.autograd._is_checkpoint_valid():
                raise RuntimeError("Checkpointing is not compatible with .grad(), please use .backward() if possible")
            inputs = deepspeed_saved_tensors
            detached_inputs = detach_variable(inputs)
            detached_inputs = merge_tensors(tensor_objects=detached_inputs, non_tensor_objects=non_tensor_args,
                                            tensor_flags=tensor_flags)

            bwd_cpu_rng_state = torch.get_rng_state()
            bwd_cuda_rng_state = get_accelerator().get_rng_state()
            bwd_cuda_rng_state_tracker = _tracker_states()

            torch.set_rng_state(fwd_cpu_rng_state)
            _set_cuda_rng_state(fwd_cuda_rng_state)
            _set_tracker_states(fwd_cuda_rng_state_tracker)

            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(replay_pack, replay_unpack):
                _unused = function(*detached_inputs)  # noqa: F841

            torch.set_rng_state(bwd_cpu_rng_state)
            _set_cuda_rng_state(bwd_cuda_rng_state)
            _set_tracker_states(bwd_cuda_rng_state_tracker)

            deepspeed_saved_tensors = None
            non_tensor_args = None
            tensor_flags = None

        if holder_from_backward not in storage:
            raise RuntimeError("Attempt to retrieve a tensor saved by autograd multiple times without checkpoint"
                               " recomputation being triggered in between, this is not currently supported.")
        return storage[holder_from_backward]

    with torch.autograd.graph.saved_tensors_hooks(checkpoint_pack, checkpoint_unpack):
        outputs = function(*inputs_cuda)
    save_args_for_backward(*args)

    all_outputs = []
    if torch.is_tensor(outputs):
        all_outputs += [outputs]
    else:
        all_outputs += outputs
    if len(all_outputs) == 1:
        return all_outputs[0]
    return tuple(all_outputs)


@torch._disable_dynamo  # compiler.lazy_disable on torch >= 2.4
def checkpoint(function, *args, **kwargs):
    CALLS.append(("checkpoint", dict(
        kwargs=tuple(kwargs), tracker=get_cuda_rng_tracker(), names=list(get_cuda_rng_tracker().get_states()))))
    if kwargs:
        run_function = function
        kwarg_keys = tuple(kwargs.keys())
        positional_arg_count = len(args)

        def function_with_kwargs(*all_args):
            positional_args = all_args[:positional_arg_count]
            keyword_args = dict(zip(kwarg_keys, all_args[positional_arg_count:]))
            return run_function(*positional_args, **keyword_args)

        function = function_with_kwargs
        args = args + tuple(kwargs.values())

    all_outputs = []
    CheckpointFunction.apply(function, all_outputs, *args)
    if len(all_outputs) == 1:
        return all_outputs[0]
    return tuple(all_outputs)
'''

ACCELERATOR = '''
"""CPU stand-in for deepspeed.accelerator: get_accelerator()/set_accelerator() and the RNG part of
CPU_Accelerator (deepspeed/accelerator/cpu_accelerator.py)."""

import os

import torch


class CPU_Accelerator:
    def __init__(self):
        self._name = "cpu"

    def device_name(self, device_index=None):
        return "cpu"

    def current_device(self):
        return os.environ.get("LOCAL_RANK", 0)

    def current_device_name(self):
        return "cpu"

    def synchronize(self, device_index=None):
        return

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def default_generator(self, device_index):
        return torch.default_generator

    def lazy_call(self, callback):
        return callback()


ds_accelerator = None


def get_accelerator():
    global ds_accelerator
    if ds_accelerator is None:
        ds_accelerator = CPU_Accelerator()
    return ds_accelerator


def set_accelerator(accel_obj):
    global ds_accelerator
    ds_accelerator = accel_obj
'''

STANDIN = {
    "deepspeed/__init__.py": (
        "from .accelerator import get_accelerator\n"
        "from .runtime.activation_checkpointing import checkpointing\n"
        "__version__ = '0.19.8+checkout'\n"  # what a source checkout without dist-info reports
    ),
    # Found before any real deepspeed's: the stand-in is first on sys.path.
    "deepspeed-0.19.8+standin.dist-info/METADATA": "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8+standin\n",
    "deepspeed/accelerator/__init__.py": ACCELERATOR,
    "deepspeed/runtime/__init__.py": "",
    "deepspeed/runtime/activation_checkpointing/__init__.py": "",
    "deepspeed/runtime/activation_checkpointing/checkpointing.py": CHECKPOINTING,
}
BROKEN = {  # what the GPU machine shows without DeepSpeed's requirements
    "deepspeed/__init__.py": "raise ModuleNotFoundError(\"No module named 'hjson' (stand-in)\")\n",
}



@pytest.fixture
def install(tmp_path, monkeypatch):
    """install(files) puts a `deepspeed` stand-in first on sys.path for this test only."""
    saved: dict[str, object] = {}

    def put(files: dict[str, str]) -> Path:
        root = tmp_path / "site-deepspeed"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        saved.update({k: v for k, v in drop_modules("deepspeed").items() if k not in saved})
        deepspeed_mod._CHECKPOINTING.forget()
        return root

    yield put
    drop_modules("deepspeed")
    sys.modules.update(saved)  # a real deepspeed imported before this test is put back
    deepspeed_mod._CHECKPOINTING.forget()


@pytest.fixture
def standin(install):
    """The stand-in's checkpointing module (its switches off, its call log empty)."""
    install(STANDIN)
    return importlib.import_module(deepspeed_mod.CHECKPOINTING_MODULE)


def _calls(checkpointing, name: str | None = None) -> list[dict]:
    return [kw for fn, kw in checkpointing.CALLS if name is None or fn == name]


# --- loading without the package -------------------------------------------------------------------


def test_the_factory_loads_without_importing_deepspeed(install):
    install(BROKEN)
    adapter = impls.load(FACTORY)
    assert isinstance(adapter, DeepSpeedAdapter) and adapter.name == "deepspeed"
    assert "deepspeed" not in sys.modules


def test_when_deepspeed_does_not_import_every_case_is_unsupported_with_the_error(install, monkeypatch):
    install(BROKEN)
    monkeypatch.setattr(packages_mod, "installed_version", lambda *dists: None)  # nor a real one (PackageAdapter)
    adapter = impls.load(FACTORY)
    reason = adapter.unavailable()
    assert reason == ("deepspeed does not import (deepspeed.runtime.activation_checkpointing.checkpointing): "
                      "ModuleNotFoundError: No module named 'hjson' (stand-in)")
    assert {adapter.supports(case) for case in generate()} == {reason}
    assert {adapter.supports(case) for case in generate(device="cuda")} == {reason}
    result = runner.run(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), adapter)
    assert result.outcome is Outcome.UNSUPPORTED and result.reason == reason
    assert adapter.version is None  # neither importable nor installed


def test_a_missing_package_is_unsupported_with_module_not_found(monkeypatch):
    monkeypatch.setattr(deepspeed_mod, "_CHECKPOINTING", LazyModule("deepspeed_nonexistent_pkg.checkpointing"))
    adapter = DeepSpeedAdapter()
    reason = adapter.supports(parse_case_id("reentrant-tracked-eager-flat-none-cuda"))
    assert "ModuleNotFoundError: No module named 'deepspeed_nonexistent_pkg'" in reason
    assert adapter.unavailable() == reason


def test_the_version_comes_from_the_distribution_first(install):
    root = install(BROKEN)
    info = root / "deepspeed-0.19.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.7\n")
    adapter = impls.load(FACTORY)
    assert adapter.version == "0.19.7"
    assert "does not import" in adapter.supports(parse_case_id("reentrant-default-eager-flat-none-cpu"))


# --- what the adapter declares -----------------------------------------------------------------------


def test_the_version_is_read_without_importing_and_else_from_the_module(install, monkeypatch):
    install(STANDIN)
    adapter = impls.load(FACTORY)
    assert adapter.version == "0.19.8+standin" and "deepspeed" not in sys.modules  # the metadata
    monkeypatch.setattr(packages_mod, "installed_version", lambda *dists: None)  # no dist-info (PackageAdapter)
    assert adapter.version == "0.19.8+checkout"  # the module's __version__


def test_supports_reasons_on_the_cpu_accelerator(standin):
    adapter = impls.load(FACTORY)
    assert adapter.unavailable() is None and adapter.accelerator_device() == "cpu"
    for case_id in ("reentrant-tracked-eager-flat-none-cpu", "nonreentrant-mixed-eager-nested-draws-cpu",
                    "reentrant-tracked-eager-native_dropout.f32.small.keyword.nested-draws-cpu",
                    "reentrant-default-eager-native_dropout.f32.small.list.flat-none-cpu",
                    "nonreentrant-default-eager-native_dropout.f32.small.closure.flat-none-cpu"):
        assert adapter.supports(parse_case_id(case_id)) is None, case_id
    assert adapter.supports(parse_case_id("reentrant-shared-eager-nested-draws-cpu")) == NO_ALIASES
    keyword_case = parse_case_id("nonreentrant-mixed-eager-native_dropout.f32.small.keyword.flat-none-cpu")
    assert adapter.supports(keyword_case) == (
        "deepspeed non_reentrant_checkpoint(function, *args) passes no keyword arguments to the region")
    on_cuda = adapter.supports(parse_case_id("reentrant-tracked-separate-flat-none-cuda"))
    assert on_cuda.startswith("DeepSpeed's accelerator here is 'cpu': its checkpoint saves and its "
                              "DeepSpeed's CudaRNGStatesTracker forks cpu RNG state; no cuda path")


def test_on_a_cuda_accelerator_cpu_cases_are_unsupported_and_cuda_cases_run(standin):
    accelerator = importlib.import_module("deepspeed.accelerator")

    class CudaAccelerator(accelerator.CPU_Accelerator):
        def device_name(self, device_index=None):
            return "cuda" if device_index is None else f"cuda:{device_index}"

    accelerator.set_accelerator(CudaAccelerator())
    adapter = DeepSpeedAdapter()
    assert adapter.accelerator_device() == "cuda"
    assert adapter.supports(parse_case_id("reentrant-tracked-single-nested-draws-cuda")) is None
    assert adapter.supports(parse_case_id("nonreentrant-untracked-separate-flat-none-cuda")) is None
    assert "no cpu path" in adapter.supports(parse_case_id("reentrant-default-eager-flat-none-cpu"))


def test_an_accelerator_that_cannot_be_determined_is_a_reason_not_a_fault(standin, monkeypatch):
    def no_accelerator():
        raise ValueError("DS_ACCELERATOR must be one of ['cuda', 'cpu']. Value 'tpu' is not supported")

    monkeypatch.setattr(standin, "get_accelerator", no_accelerator)
    result = runner.run(parse_case_id("reentrant-default-eager-flat-none-cpu"), impls.load(FACTORY))
    assert result.outcome is Outcome.UNSUPPORTED
    assert result.reason == ("DeepSpeed's get_accelerator() failed: ValueError: DS_ACCELERATOR must be one of "
                             "['cuda', 'cpu']. Value 'tpu' is not supported")


def test_a_deepspeed_without_non_reentrant_checkpoint_declares_that_mode(standin, monkeypatch):
    monkeypatch.delattr(standin, "non_reentrant_checkpoint")
    adapter = DeepSpeedAdapter()
    assert adapter.supports(parse_case_id("nonreentrant-default-eager-flat-none-cpu")) == (
        "this deepspeed has no non_reentrant_checkpoint")
    assert adapter.supports(parse_case_id("reentrant-default-eager-flat-none-cpu")) is None


def test_non_reentrant_checkpoint_is_never_handed_keywords(standin):
    adapter = DeepSpeedAdapter()
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(TypeError, match="no keyword arguments"):
        adapter.checkpoint(lambda *, inp: inp * 2, reentrant=False, tracker=None, inp=x)
    assert _calls(standin) == []


# --- running the matrix through the stand-in -----------------------------------------------------------


def test_the_correct_standin_passes_every_first_matrix_case_it_runs(standin):
    adapter = impls.load(FACTORY)
    ran = 0
    for case in CPU_CASES:
        standin.CALLS.clear()
        result = runner.run(case, adapter)
        if case.layout is Layout.SHARED:
            assert result.outcome is Outcome.UNSUPPORTED and result.reason == NO_ALIASES, case.id
            assert result.mismatches == [] and standin.CALLS == []
            continue
        assert result.outcome is Outcome.PASS, f"{case.id}: {result.summary()}"
        assert result.impl_version == "0.19.8+standin"
        entry = "checkpoint" if case.mode is Mode.REENTRANT else "non_reentrant_checkpoint"
        calls = _calls(standin)
        assert calls and len(calls) == len(_calls(standin, entry)), case.id  # only its mode's function
        # DeepSpeed reads its own global tracker, never the harness's view of it.
        assert all(kw["tracker"] is standin.get_cuda_rng_tracker() for kw in calls)
        if case.layout is Layout.UNTRACKED:
            assert all(kw["names"] == [] for kw in calls), case.id
        ran += 1
    assert ran == sum(case.layout is not Layout.SHARED for case in CPU_CASES) == 48


def test_a_keyword_region_is_folded_into_positional_arguments_by_deepspeed(standin):
    adapter = impls.load(FACTORY)
    case = parse_case_id("reentrant-tracked-eager-native_dropout.f32.small.keyword.nested-draws-cpu")
    result = runner.run(case, adapter)
    assert result.outcome is Outcome.PASS, result.summary()
    calls = _calls(standin, "checkpoint")
    assert calls and all(kw["kwargs"] == ("inp",) for kw in calls)  # the harness's keyword reaches DeepSpeed


@pytest.mark.parametrize("bug", ["IGNORE_TRACKER", "LIVE_STATES_DICT"])
def test_a_broken_standin_is_caught_where_sites_draw_from_the_tracker(standin, bug):
    setattr(standin, bug, True)
    adapter = impls.load(FACTORY)
    for case in CPU_CASES:
        if case.layout is Layout.SHARED:
            continue
        result = runner.run(case, adapter)
        if case.layout in TRACKED_LAYOUTS:
            assert result.outcome is Outcome.MISMATCH, f"{bug} {case.id}: {result.summary()}"
            oracles = {m.oracle for m in result.mismatches}
            assert CAUGHT_BY <= oracles, (bug, case.id, oracles)
            # Neither bug touches a forward; only what a recompute leaked reaches the next one.
            assert all(m.iteration > 0 for m in result.mismatches if m.oracle == "forward-mask"), case.id
        else:
            assert result.outcome is Outcome.PASS, f"{bug} {case.id}: {result.summary()}"


# --- DeepSpeed's global tracker --------------------------------------------------------------------------


def test_make_tracker_empties_the_global_tracker_streams_and_seeds(standin):
    adapter = DeepSpeedAdapter()
    first = adapter.make_tracker(torch.device("cpu"))
    assert isinstance(first, TrackerView) and first.real is standin.get_cuda_rng_tracker()
    first.add("model-parallel", 2718)
    second = adapter.make_tracker(torch.device("cpu"))
    assert second.real is first.real and second.names() == [] and second.real.seeds_ == set()
    second.add("model-parallel", 2718)  # the same seed again: DeepSpeed's add refuses a seed it saw
    assert not hasattr(second, "generator") and second.generators() == []  # values, not objects


def test_the_tracker_is_reset_between_cases(standin, monkeypatch):
    adapter = impls.load(FACTORY)
    tracked = parse_case_id("reentrant-tracked-eager-flat-none-cpu")
    assert runner.run(tracked, adapter).outcome is Outcome.PASS
    left = standin.get_cuda_rng_tracker()
    assert list(left.get_states()) and left.seeds_  # the case leaves its stream behind ...
    again = runner.run(tracked, adapter)  # ... which the next run's tracker must not see
    assert again.outcome is Outcome.PASS, again.summary()
    standin.CALLS.clear()
    untracked = runner.run(parse_case_id("nonreentrant-untracked-eager-siblings-draws-cpu"), adapter)
    assert untracked.outcome is Outcome.PASS, untracked.summary()
    assert _calls(standin) and all(kw["names"] == [] for kw in _calls(standin))
    # Without the reset the next run adds a seed DeepSpeed's tracker has already seen (the case's
    # checkpointed run after its reference run: made afresh, not the one kept from the runs above).
    monkeypatch.setattr(standin.CudaRNGStatesTracker, "reset", lambda self: None)
    REFERENCES.clear()
    broken = runner.run(tracked, adapter)
    assert broken.outcome is Outcome.ERROR and "already exists" in broken.error


def test_checkpoint_refuses_a_global_tracker_replaced_behind_its_back(standin, monkeypatch):
    adapter = DeepSpeedAdapter()
    tracker = adapter.make_tracker(torch.device("cpu"))
    monkeypatch.setattr(standin, "_CUDA_RNG_STATE_TRACKER", standin.CudaRNGStatesTracker())
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="not the tracker this run built"):
        adapter.checkpoint(lambda h: h * 2, x, reentrant=True, tracker=tracker)


# --- the real DeepSpeed, where it is installed -------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_real_deepspeed_passes_the_first_matrix_on_its_cpu_accelerator(tmp_path):
    """DS_ACCELERATOR=cpu: DeepSpeed's own code, CPU generator for its "cuda" state and streams."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--impl", FACTORY, "--device", "cpu",
         "--program", "flat,nested,siblings",
         "--report-dir", str(tmp_path / "report"), "-q", "--no-isolate"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,  # a last resort, not a speed test
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "report" / "results.jsonl").read_text().splitlines()]
    outcomes = {(r["layout"], r["outcome"]) for r in records}
    assert outcomes == {(layout.value, "unsupported" if layout is Layout.SHARED else "pass") for layout in Layout}


# --- deepspeed-partition: partition_activations=True over the TP group of --ranks N (issue 41) --------


def test_partitioning_needs_a_process_group(standin):
    adapter = impls.load("deepspeed-partition")
    reason = adapter.supports(parse_case_id("reentrant-tracked-eager-flat-none-cpu"))
    assert reason is not None and "run with --ranks N" in reason


@pytest.mark.parametrize("spec, layout, region", [
    ("default-eager-(native_dropout)+(native_dropout)", (2, 2, 1), None),  # default stream: alike everywhere
    ("tracked-eager-(native_dropout)+(native_dropout)", (2, 2, 1), "r1"),  # a TP-seeded draw feeds r1
    ("tracked-eager-(native_dropout@c)+(native_dropout@c)", (2, 2, 1), None),  # CP 1: the CP stream is alike
    ("tracked-eager-(native_dropout@c)+(native_dropout@c)", (4, 2, 2), "r1"),
    ("tracked-eager-(native_dropout+(native_dropout))", (2, 2, 1), "r1"),  # inner region after the draw
])
def test_partitioning_is_unsupported_where_a_region_input_may_differ_between_ranks(spec, layout, region):
    from harness import rank_context
    from harness.impls.ranked import entered_after_rank_draw

    world, tp, cp = layout
    case = parse_case_id(f"reentrant-{spec}-none-cpu")
    try:
        rank_context.enter(1, world, tp, cp)
        assert entered_after_rank_draw(case) == region
    finally:
        rank_context.enter(0, 1)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_real_deepspeed_partitions_over_two_cpu_ranks(monkeypatch):
    """Two CPU ranks: the RNG is right where it runs; an odd element count trips DeepSpeed's
    assertion (proof the activations are split: one rank would not); a list argument reaches the
    recompute with a stray None (deepspeedai/DeepSpeed PR #8455)."""
    from harness.run.ranks import run_ranked

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cases = [parse_case_id(c) for c in ("reentrant-tracked-eager-flat-none-cpu",
                                        "nonreentrant-default-eager-siblings-draws-cpu",
                                        "nonreentrant-default-eager-native_dropout.f32.odd.positional.flat-none-cpu",
                                        "nonreentrant-default-eager-native_dropout.f32.small.list.flat-none-cpu")]
    results = [result for _, result in run_ranked("deepspeed-partition", cases, 2, 300.0)]
    assert [r.outcome.value for r in results[:2]] == ["pass", "pass"], [r.summary() for r in results]
    assert results[2].error.startswith("AssertionError: Doesn't handle if partition activation") and \
        results[2].error.endswith("[every rank]")
    assert results[3].error.startswith("TypeError:") and "positional argument" in results[3].error


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_real_deepspeed_partition_recomputes_a_closure_from_the_emptied_argument(monkeypatch):
    """findings/deepspeed-partition-closure-empty-input.md: the fuzzer's shrunk case fails as the
    emptied-argument model says; the outer region recomputing first refills the argument."""
    from harness.run.ranks import run_ranked

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cases = [parse_case_id(f"nonreentrant-default-eager-{spec}-none-cpu")
             for spec in ("(closure(native_dropout))", "(closure(native_dropout)+native_dropout)")]
    emptied, refilled = [result for _, result in run_ranked("deepspeed-partition", cases, 2, 300.0)]
    assert {m.oracle for m in emptied.mismatches} == {"recompute-mask", "gradient"}, emptied.summary()
    assert any("got torch.bool()" in m.message() for m in emptied.mismatches)  # a mask of shape ()
    assert refilled.outcome.value == "pass", refilled.summary()
