"""`megatron` and `megatron-graphsafe`: Megatron-core's `tensor_parallel.checkpoint` and its tracker.

Both adapters drive the real code of ``megatron.core.tensor_parallel.random``:

* the tracker is Megatron's global `CudaRNGStatesTracker`, rebuilt for every run of every case with
  ``initialize_rng_tracker(use_cudagraphable_rng=X, force_reset=True)`` (the first initialisation
  otherwise wins and would leak flags and streams from one case into the next);
  ``megatron`` uses the plain tracker (value ByteTensors), ``megatron-graphsafe`` the graph-safe one
  (`torch.Generator` objects from ``clone_state()``, swapped in with ``graphsafe_set_state``);
* the checkpoint is ``tensor_parallel.checkpoint(fn, False, *args)``
  (``distribute_saved_activations=False``, so no process group is needed), which reads and writes
  the *global* tracker through ``get_cuda_rng_tracker().get_states()/set_states()``;
* streams are added with the harness's own seeds (``add(name, seed)``), not through
  ``model_parallel_cuda_manual_seed``, so no parallel ranks are involved.

What the harness holds is a `TrackerView` of that same global tracker: it forwards `add` and
`fork`, and gives the harness value snapshots (`get_states`) and in-place writes (`set_states`) for
its own bookkeeping.  Megatron's checkpoint never sees the view: it reads the global tracker
directly, so what is tested is Megatron's own save/restore.

Declared unsupported (`supports`): every case when the code cannot be loaded here (`unavailable`:
megatron-core does not import, with the error; for the graph-safe tracker, a torch without the
graph-safe generator APIs), the cpu device (the tracker and checkpoint are CUDA-only), the shared
layout (Megatron's tracker has no aliases: a second name for one stream would live only in the
harness's view, so the case would test the harness's own alias bookkeeping, not Megatron), and
non-reentrant mode (``checkpoint`` is an autograd.Function; Megatron's other path,
``CheckpointWithoutOutput``, is not a drop-in checkpoint: the caller must discard outputs and
register a recompute hook, and its recompute JIT-compiles a C++ extension with ``load_inline``).
Capture cases run for real: Megatron's checkpoint bypasses itself only under Megatron's own
graph-capture flags, which the harness's executors do not set.

The helpers here (`TrackerView`, `LazyModule`, `installed_version`) are shared with the
TransformerEngine adapter.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
import warnings
from typing import Any, Callable, Iterable, Mapping

import torch

from ..cases import Case, Device, Layout, Mode, Passing
from .base import Adapter

RANDOM_MODULE = "megatron.core.tensor_parallel.random"
DISTRIBUTION = "megatron-core"


# --- shared helpers ------------------------------------------------------------------------------


class LazyModule:
    """A module imported on first use; the import error, if any, is kept as a one-line string.

    Adapters must load (and list their cases) whether or not the package is installed, so nothing
    is imported at factory time.  Any exception counts as "does not import": a broken install can
    raise OSError or a RuntimeError as easily as ImportError.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._module: Any = None
        self._error: str | None = None
        self._tried = False

    def load(self) -> Any:
        """The module, or None when it does not import (see `error`)."""
        if not self._tried:
            self._tried = True
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # import-time chatter about optional extras
                    self._module = importlib.import_module(self.name)
            except (Exception, SystemExit) as exc:  # a broken package may exit, not just fail
                message = " ".join(str(exc).split())  # one line, for reports and pytest skips
                self._error = f"{type(exc).__name__}: {message}".strip()
        return self._module

    @property
    def error(self) -> str | None:
        self.load()
        return self._error

    def require(self) -> Any:
        """The module; raises ImportError with the kept message when it does not import."""
        module = self.load()
        if module is None:
            raise ImportError(f"{self.name} does not import: {self._error}")
        return module

    def forget(self) -> None:
        """Drop the cached result, so the next use imports again (tests swap stand-ins)."""
        self._module, self._error, self._tried = None, None, False


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, or None."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # a malformed dist-info is no reason to crash a report
            continue
    return None


def graphsafe_apis_missing() -> list[str]:
    """The torch APIs a graph-safe tracker needs that this torch build lacks."""
    wanted = [
        (getattr(torch.cuda, "CUDAGraph", None), "register_generator_state", "CUDAGraph"),
        (torch.Generator, "graphsafe_set_state", "Generator"),
        (torch.Generator, "graphsafe_get_state", "Generator"),
        (torch.Generator, "clone_state", "Generator"),
    ]
    return [f"{owner}.{attr}" for obj, attr, owner in wanted if obj is None or not hasattr(obj, attr)]


def no_aliases_reason(tracker: str) -> str:
    """Why an adapter over a tracker without aliases declares the shared layout unsupported."""
    return (f"{tracker} has no aliases: the shared layout would test only the harness's own alias "
            "bookkeeping, not the package")


def _value(state: Any) -> torch.Tensor:
    """A value copy of a tracker state: a Generator's state, or a clone of a state tensor."""
    if isinstance(state, torch.Generator):
        return state.get_state()
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    raise TypeError(f"tracker state of unexpected type {type(state).__name__}")


class TrackerView:
    """The harness's handle on an upstream RNG tracker (Megatron-core's or TransformerEngine's).

    `real` is the upstream tracker object itself; the checkpoint under test works on it directly.
    The view adds what the harness needs and upstream trackers lack (it has no aliases, as upstream
    has none: adapters over it declare the shared layout unsupported):

    * `names()`: the upstream stream names, in upstream order;
    * `get_states()`: name -> value copy, whatever upstream stores (value ByteTensors in plain
      mode, live `torch.Generator` objects in graph-safe mode);
    * `set_states(values)`: writes values in place, into the existing Generator objects in
      graph-safe mode (so CUDA graphs that registered them still see them) or as fresh tensors in
      plain mode, then hands the dict back through upstream's own ``set_states``;
    * `generators()` / `generator(name)`: the distinct Generator objects (for graph registration)
      and the object behind a name (graph-safe mode only, see `generator`).
    """

    def __init__(self, real: Any, device: "torch.device | str | None" = None) -> None:
        self.real = real
        self.device = torch.device(device) if device is not None else None

    def _upstream(self) -> dict[str, Any]:
        return dict(self.real.get_states())

    def add(self, name: str, seed: int) -> None:
        """Add stream `name` to the upstream tracker, seeded with `seed`."""
        self.real.add(name, seed)

    def names(self) -> list[str]:
        """The upstream stream names, in upstream order."""
        return list(self._upstream())

    def fork(self, name: str) -> contextlib.AbstractContextManager:
        """Upstream's own ``fork(name)``: draws inside it come from stream `name`."""
        return self.real.fork(name)

    def get_states(self) -> dict[str, torch.Tensor]:
        """Name -> a value copy of each upstream stream (never a live object)."""
        return {name: _value(state) for name, state in self._upstream().items()}

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Write `states` (values or Generators) upstream: into Generators in place, else as copies."""
        current = self._upstream()
        for name, value in states.items():
            if name not in current:
                raise KeyError(f"unknown RNG stream {name!r}")
            value = _value(value)
            if isinstance(current[name], torch.Generator):
                current[name].set_state(value)
            else:
                current[name] = value
        self.real.set_states(current)

    @property
    def generator(self) -> Callable[[str], torch.Generator]:
        """``generator(name)``: the upstream Generator object behind `name`, for the stream
        inventory.  Only where upstream keeps Generator objects (graph-safe mode): in plain mode
        it keeps value tensors that every fork replaces, so no object's identity means anything and
        the attribute is missing (``hasattr(view, "generator")`` is False)."""
        if not self.generators():
            raise AttributeError("generator: the upstream tracker keeps values, not Generator objects")
        return self._generator

    def _generator(self, name: str) -> torch.Generator:
        return self._upstream()[name]

    def generators(self) -> list[torch.Generator]:
        """The distinct upstream Generator objects (none in plain mode), for graph registration."""
        out: list[torch.Generator] = []
        for state in self._upstream().values():
            if isinstance(state, torch.Generator) and all(state is not g for g in out):
                out.append(state)
        return out

    def __repr__(self) -> str:
        return f"<TrackerView of {type(self.real).__module__}.{type(self.real).__qualname__}: {self.names()}>"


def module_version(module: Any, attrs: Iterable[str]) -> str | None:
    """The first string among dotted attribute paths of `module` (e.g. 'package_info.__version__')."""
    for path in attrs:
        obj = module
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, str) and obj:
            return obj
    return None


# --- Megatron-core -------------------------------------------------------------------------------

_RANDOM = LazyModule(RANDOM_MODULE)


class MegatronAdapter(Adapter):
    """`tensor_parallel.checkpoint` with Megatron's global tracker in one mode (plain or graph-safe)."""

    name = "megatron"
    description = "megatron.core.tensor_parallel.checkpoint with the plain CudaRNGStatesTracker"
    graphsafe = False
    devices: tuple[str, ...] = (Device.CUDA.value,)  # tests with a CPU stand-in widen this

    def __init__(self, graphsafe: bool = False) -> None:
        self.graphsafe = graphsafe
        if graphsafe:
            self.name = "megatron-graphsafe"
            self.description = (
                "megatron.core.tensor_parallel.checkpoint with the graph-safe CudaRNGStatesTracker "
                "(use_cudagraphable_rng=True)"
            )

    # -- the module under test

    @staticmethod
    def module() -> Any:
        """``megatron.core.tensor_parallel.random``; ImportError (with the reason) if it does not import."""
        return _RANDOM.require()

    @property
    def import_error(self) -> str | None:
        return _RANDOM.error

    @property
    def version(self) -> str | None:
        """The installed megatron-core version; for a source checkout (no dist-info), its package_info.

        The distribution's metadata is read first, so asking for the version does not import
        megatron-core (a process that only writes reports never pays for the import).
        """
        found = installed_version(DISTRIBUTION)
        if found is None and _RANDOM.load() is not None:
            found = module_version(sys.modules.get("megatron.core"), ("package_info.__version__", "__version__"))
        return found

    # -- the adapter interface

    def unavailable(self) -> str | None:
        """None when megatron-core imports (and, for the graph-safe tracker, torch has the
        graph-safe generator APIs), else one line saying why not."""
        error = self.import_error
        if error is not None:
            return f"megatron-core does not import ({RANDOM_MODULE}): {error}"
        if self.graphsafe:
            missing = graphsafe_apis_missing()
            if missing:
                return ("the graph-safe tracker needs torch APIs this build lacks: "
                        f"{', '.join(missing)}")
        return None

    def supports(self, case: Case) -> str | None:
        """None for reentrant cuda cases outside the shared layout (when available), else why."""
        reason = self.unavailable()
        if reason is not None:
            return reason
        if case.device.value not in self.devices:
            return (f"Megatron-core's CudaRNGStatesTracker and checkpoint are CUDA-only "
                    f"(torch.cuda RNG state, CUDA default generators); no {case.device.value} path")
        if case.layout is Layout.SHARED:
            return no_aliases_reason("Megatron-core's CudaRNGStatesTracker")
        if Passing.KEYWORD in case.program.passings():
            return ("megatron.core.tensor_parallel.checkpoint(function, distribute_saved_activations, *args) "
                    "passes no keyword arguments to the region")
        if case.mode is Mode.NONREENTRANT:
            return ("Megatron-core's tensor_parallel.checkpoint is reentrant only (an autograd.Function); "
                    "its other path, CheckpointWithoutOutput, is no drop-in checkpoint (the caller "
                    "discards outputs and registers a recompute hook) and JIT-builds a C++ extension")
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
        return random.get_cuda_rng_tracker(use_cudagraphable_rng=self.graphsafe)

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
        random = self.module()
        if not reentrant:
            raise NotImplementedError("Megatron-core's checkpoint is reentrant only")
        self._global_tracker_for(random, tracker)
        if kwargs:
            raise TypeError("megatron.core.tensor_parallel.checkpoint takes no keyword arguments for the region")
        return random.checkpoint(fn, False, *args)


def make_megatron() -> Adapter:
    return MegatronAdapter(graphsafe=False)


def make_megatron_graphsafe() -> Adapter:
    return MegatronAdapter(graphsafe=True)
