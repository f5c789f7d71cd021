"""Module mode's run: a user's model (a factory's `ModelCase`) built three times, run as the
reference twice and checkpointed once, and judged bit for bit by the matrix's oracles.  The front
(`harness.fronts.module_mode`: ``python -m harness module``) loads the factory and checks the
arguments; `harness.fronts.module_report` presents what this returns.

Two parameters of a factory mean something:

* ``rng_tracker``: it is given the impl's own RNG tracker object for that build
  (TransformerEngine's or Megatron-core's ``CudaRNGStatesTracker``, the bundled
  ``RNGStatesTracker``); the factory adds the streams its model forks, as a training script would,
  and hands the tracker to its layers.  The harness adds its own tracked stream too
  (``model-parallel-rng``), so a tracker the model never forks is still checked for being left where
  it was.
* ``checkpointing``: the model can checkpoint itself, as transformers' and timm's models do
  (``activation_checkpointing_enable()``, before it ``gradient_checkpointing_enable()``:
  `harness.checkpoint.hf`; ``set_grad_checkpointing()``).  Under ``--impl as-built``
  the reference builds get ``checkpointing=False`` and the build under test ``checkpointing=True``,
  and the library's own checkpointing is what is judged; under any other impl every build gets
  ``False`` and the impl checkpoints what ``--wrap`` selects.

The harness builds the module three times from the same RNG states (the builds must have
bit-identical parameters and buffers): the reference, a second reference, and the build under
test.  The reference runs twice and must agree with itself bit for bit, or no oracle can judge the
model (outcome ``skipped``, "cannot judge").  Under an impl, the forward of every submodule whose
``named_modules()`` path matches a ``--wrap`` pattern (`wrapped_paths`: ``*`` one path component,
``**`` any number of them; default ``""``, the whole module) is run through the impl's checkpoint;
keyword arguments reach a reentrant checkpoint bound with ``functools.partial``, as transformers
binds them.  Before the build under test runs, the impl is asked whether it supports what the
reference did (`module_case`: the mode, the capture, the RNG ops the model drew); a declared limit
is outcome ``unsupported`` with its reason.  Per iteration, bit for bit, through `harness.check.oracles`:

* every RNG draw: a dispatch mode records each op tagged ``nondeterministic_seeded`` with the
  submodule path running it, in forward and in recompute, under the name ``PATH (aten::op)``, by
  what it drew (`rng_output`: dropout's mask, fused attention's Philox seed and offset).  Paths
  come from each submodule's ``forward`` (not its hooks), so a recompute that calls ``forward``
  directly is seen too.  Forward draws are compared with the reference's (``forward-mask``) and
  recompute draws with the forward's (``recompute-mask``); a draw inside a checkpointed submodule
  that the reference made in that iteration and the recompute never redrew is a failure too.
  Which submodules are checkpointed: the wrapped ones under an impl; under ``as-built``, every
  submodule whose forward ran again in backward (and no parent of it did) in that iteration;
* the outputs and the loss (``output``), the gradients of the inputs and of every parameter
  (``gradient``), every buffer (``buffer``: running statistics and counters), every live stream
  after backward, tracker streams included (``live-stream``), tracker stream identity, and that
  forward draws change between iterations where the reference's did.

The loss is the sum of every floating output times a fixed random weight (from a private
generator), or the case's own ``loss(output)``.  `first_divergent_draw` names the first draw that
went wrong, in the order the draws happened; a difference with no divergent draw and every stream
where the reference's is gets a diagnosis instead (`diagnose`: numerical, or module state).

What the draw log cannot see: RNG drawn inside a kernel that is not an aten op tagged
``nondeterministic_seeded`` (cuDNN fused attention's dropout, for one) is not a draw of the log,
though the outputs, gradients and live streams it changes are still compared.  And while the
dispatch mode is active, dynamo does not compile: a ``torch.compile``'d function inside the model
runs eagerly, in the reference and the checkpointed run alike.
"""

from __future__ import annotations

import contextvars
import fnmatch
import functools
import inspect
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from ..check.compare import Mismatch
from ..check.oracles import check
from ..check.records import FORWARD, LOSS, RECOMPUTE, MaskLog, RunRecord
from ..checkpoint import RNGStatesTracker, hf
from ..errors import UsageError
from ..impls import one_line
from ..model import ops
from ..model.cases import Capture, Case, Device, Interleave, Layout, Mode
from ..model.programs import Op, ProgramError
from ..model.spec import parse_program
from ..results import AS_BUILT
from .capture import execute
from .draws import (
    DrawLog,
    diagnose,
    draw_op,
    draw_path,
    first_divergent_draw,
    frozen_only,
    rounding_only,
    worst_differences,
)
from .execution import must_support
from .runner import (
    STDLIB_DIR,
    TORCH_DIR,
    NotReproducible,
    TrackedRun,
    declared_unsupported,
    reproduction_difference,
)
from .streams import preserved_global_rng, stream_objects
from .workload import make_tracker_streams, seed_all


def raised_in(exc: BaseException) -> str:
    """Where `exc` was raised, as ``package/file.py:LINE (function)``: the innermost frame of its
    traceback outside torch and Python's standard library (whose frames only pass the call on), its
    path relative to the import root it was loaded from; '' where every frame is theirs."""
    roots = sorted((os.path.join(os.path.abspath(p), "") for p in sys.path if p), key=len, reverse=True)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(frame.filename).resolve())
        if path.startswith((TORCH_DIR, STDLIB_DIR)):
            continue
        root = next((r for r in roots if path.startswith(r)), None)
        return f"{os.path.relpath(path, root) if root else path}:{frame.lineno} ({frame.name})"
    return ""


class ModuleError(UsageError):
    """Bad input to module mode (a factory that does not import, raises or returns the wrong
    thing; a --wrap pattern that matches nothing); the message is one line for the user."""


TRACKER_PARAMETER = "rng_tracker"  # the factory parameter that receives the impl's tracker
CHECKPOINTING_PARAMETER = "checkpointing"  # the factory parameter that turns the model's own on


@dataclass
class ModelCase:
    """What a factory returns: the module, its example inputs (a tensor, a tuple of positional
    inputs or a dict of keyword inputs) and optionally the loss of its output."""

    module: torch.nn.Module
    inputs: Any
    loss: Callable[[Any], torch.Tensor] | None = None


class AsBuilt:
    """``--impl as-built``: no checkpoint of ours; the model's own checkpointing (its factory's
    ``checkpointing=True``) is what is judged.  Its tracker is the bundled one, for a factory that
    takes ``rng_tracker``."""

    name = AS_BUILT
    description = "the model's own checkpointing: its factory built with checkpointing=True"
    as_built = True
    version = None

    def make_tracker(self, device: Any) -> Any:
        return RNGStatesTracker(device)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        raise TypeError("as-built wraps nothing: the model checkpoints itself")


def takes(factory: Callable[..., Any], parameter: str) -> bool:
    """True when `factory` has a parameter named `parameter` (``rng_tracker``, ``checkpointing``)."""
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature takes nothing of ours
        return False


def takes_tracker(factory: Callable[..., Any]) -> bool:
    """True when `factory` has a parameter named ``rng_tracker`` (it is then given the impl's tracker)."""
    return takes(factory, TRACKER_PARAMETER)


def new_tracker(impl: Any, device: torch.device) -> Any:
    """A fresh tracker of `impl` (None where the impl has none) with the harness's tracked stream."""
    make_tracker = getattr(impl, "make_tracker", None)
    tracker = make_tracker(device) if make_tracker is not None else None
    make_tracker_streams(tracker, Layout.TRACKED)  # the tracked stream, as the matrix has it
    return tracker


def build(factory: Callable[..., Any], path: str, device: torch.device, tracker: Any = None,
          checkpointing: bool = False) -> ModelCase:
    """Call `factory` after seeding every generator (so two builds are the same), passing it the
    upstream object of `tracker` when it takes ``rng_tracker`` and `checkpointing` when it takes
    ``checkpointing``, and check what it returns; the module (in training mode) and its inputs
    are moved to `device`."""
    kwargs: dict[str, Any] = {}
    if takes_tracker(factory):
        if tracker is None:
            raise ModuleError(f"factory {path} takes {TRACKER_PARAMETER}, but this impl has no RNG tracker")
        kwargs[TRACKER_PARAMETER] = getattr(tracker, "real", tracker)  # the upstream object, not the harness's view
    if takes(factory, CHECKPOINTING_PARAMETER):
        kwargs[CHECKPOINTING_PARAMETER] = checkpointing
    seed_all()
    try:
        made = factory(**kwargs)
    except (Exception, SystemExit) as exc:
        raise ModuleError(f"factory {path} raised {one_line(exc)}") from None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made = ModelCase(*made)
    if not isinstance(made, ModelCase) or not isinstance(made.module, torch.nn.Module):
        raise ModuleError(f"factory {path} returned {type(made).__name__}, expected a ModelCase or a "
                          "tuple (nn.Module, inputs)")
    inputs = made.inputs
    if not (isinstance(inputs, (torch.Tensor, tuple, list, dict))):
        raise ModuleError(f"factory {path} returned inputs of type {type(inputs).__name__}, expected a "
                          "tensor, a tuple or a dict of them")
    made.module = made.module.to(device).train()
    made.inputs = _map_tensors(inputs, lambda t: t.to(device))
    return made


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with every tensor in it (at any depth of tuples, lists, dicts, ...) replaced by `fn`'s."""
    return tree_map_only(torch.Tensor, fn, value)


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in `value`, in pytree order."""
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def path_matches(path: str, pattern: str) -> bool:
    """Whether a ``named_modules()`` path matches a --wrap pattern, component by component:
    ``*`` (and ``?``, ``[...]``) within one component, ``**`` any number of components (none
    included); ``''`` is the whole module.  ``transformer.h.*`` is the blocks, not their insides."""
    def match(parts: list[str], pats: list[str]) -> bool:
        if not pats:
            return not parts
        if pats[0] == "**":
            return any(match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and match(parts[1:], pats[1:])

    return match(path.split(".") if path else [], pattern.split(".") if pattern else [])


def wrapped_paths(module: torch.nn.Module, patterns: list[str]) -> list[str]:
    """The submodule paths (``named_modules()`` names, '' the whole module) matching any pattern
    (`path_matches`); `ModuleError` for a pattern that matches nothing."""
    names = [name for name, _ in module.named_modules()]
    found: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if path_matches(n, pattern)]
        if not hits:
            shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            raise ModuleError(f"--wrap {pattern!r} matches no submodule; paths: {shown}")
        found += [h for h in hits if h not in found]
    return found


def _nests(paths: list[str]) -> bool:
    """Whether one of the submodule `paths` lies inside another (checkpointed regions would nest)."""
    return any(inner != outer and _under(inner, outer) for inner in paths for outer in paths)


def runnable_wrapped(module: torch.nn.Module, wrapped: list[str], patterns: list[str]
                     ) -> tuple[list[str], list[str]]:
    """(the wrapped paths whose module has a forward of its own, the containers left out).

    A ``ModuleList`` or ``ModuleDict`` has no forward: the model calls its children one by one, so
    checkpointing its forward checkpoints nothing, and every draw inside it would look "never
    recomputed", blamed on a correct checkpoint.  Where a pattern also selects modules that have a
    forward (``**``), such containers are left out and the summary says so; a pattern that selects
    only containers is the user's mistake: `ModuleError`, naming what to wrap instead."""
    modules = dict(module.named_modules())
    containers = [path for path in wrapped if type(modules[path]).forward is torch.nn.Module.forward]
    for pattern in patterns:
        hits = [path for path in wrapped if path_matches(path, pattern)]
        if hits and all(path in containers for path in hits):
            shown = ", ".join(f"{p!r} ({type(modules[p]).__name__})" for p in hits[:4]) + (", ..." if len(hits) > 4
                                                                                          else "")
            raise ModuleError(f"--wrap {pattern!r} selects {shown}, which has no forward of its own: the model calls "
                              "its children one by one, so checkpointing it would checkpoint nothing; wrap what "
                              f"runs, e.g. --wrap '{hits[0]}.*'")
    return [path for path in wrapped if path not in containers], containers


def _under(path: str, root: str) -> bool:
    """True when submodule `path` is `root` or inside it ('' is the whole module)."""
    return root == "" or path == root or path.startswith(root + ".")


class ModuleSession(TrackedRun):
    """One run of the module (reference, or under test), as the executors of `harness.run.capture`
    drive it (the `capture.Step` protocol)."""

    def __init__(self, made: ModelCase, tracker: Any, device: torch.device, impl: Any, mode: Mode,
                 wrapped: list[str], loss_weights: list[torch.Tensor] | None = None) -> None:
        """`tracker`: the one `made` was built with (`new_tracker`); `wrapped`: the submodule paths
        whose forward `impl` checkpoints (none: the reference, or the model's own checkpointing)."""
        self.made, self.device, self.tracker = made, device, tracker
        seed_all()
        self.initial_tracker_states = self.tracker.get_states() if self.tracker is not None else {}
        self.record = RunRecord(MaskLog(), objects_before=stream_objects(self.tracker))
        self.stack: list[str] = []
        self.busy = [False]  # shared by this session's draw logs (`DrawLog`)
        self.inputs = _map_tensors(made.inputs, lambda t: t.detach().clone().requires_grad_(t.is_floating_point()))
        self.params = dict(made.module.named_parameters())
        self.loss_weights = loss_weights
        self.wrapped = wrapped
        # Iteration -> the paths whose forward ran in backward (a recompute); under capture the
        # recompute runs once, while capturing, and holds for every replay.
        self.recomputed: dict[int, set[str]] = {}
        self.keywords: set[str] = set()  # paths whose forward was given keyword arguments
        self._originals = self._track_paths()
        self._wrap(impl, mode)

    # -- set-up

    def _track_paths(self) -> list[tuple[torch.nn.Module, str, Any]]:
        """Replace every submodule's ``forward`` by one that puts its path on the stack, notes a
        run in backward and logs draws from inside whatever dispatch mode a checkpoint entered
        around it (`_run_as`).  ``forward``, not ``__call__`` hooks: a recompute may call
        ``forward`` directly.  A submodule that checkpoints itself through a checkpoint function of
        its own (transformers' layers: `hf.CHECKPOINT_FUNCTION`) gets one that runs what it
        checkpoints under its path too: since transformers 5.23 that is its class's ``forward``
        (the function, not the instance's ``forward``), which a recompute calls directly.
        Returns what `close` puts back: (submodule, attribute, its own value or None)."""
        originals: list[tuple[torch.nn.Module, str, Any]] = []
        for name, sub in self.made.module.named_modules():
            original = sub.forward
            originals.append((sub, "forward", sub.__dict__.get("forward")))

            def tracked(*args: Any, _original: Callable = original, _path: str = name, **kwargs: Any) -> Any:
                return self._run_as(_path, _original, args, kwargs)

            sub.forward = functools.wraps(original)(tracked)  # type: ignore[method-assign]
            own = sub.__dict__.get(hf.CHECKPOINT_FUNCTION)
            if callable(own):
                originals.append((sub, hf.CHECKPOINT_FUNCTION, own))

                def through(function: Callable, *args: Any, _own: Callable = own, _path: str = name,
                            **kwargs: Any) -> Any:
                    def run(*inner: Any, **inner_kwargs: Any) -> Any:
                        return self._run_as(_path, function, inner, inner_kwargs)

                    return _own(run, *args, **kwargs)

                setattr(sub, hf.CHECKPOINT_FUNCTION, through)
        return originals

    def _run_as(self, path: str, function: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Call ``function(*args, **kwargs)`` as submodule `path`: on the stack, noted as
        recomputed in backward, with a draw log inside the checkpoint's own dispatch modes."""
        log = self.record.log
        if log.phase == RECOMPUTE:
            self.recomputed.setdefault(log.iteration, set()).add(path)
        if kwargs:
            self.keywords.add(path)
        depth = len(self.stack)
        self.stack.append(path)
        try:
            with DrawLog(log, self.stack, self.busy):  # inside the checkpoint's own modes
                return function(*args, **kwargs)
        finally:
            # A recompute stopped early (torch's non-reentrant checkpoint raises inside a
            # submodule's forward) leaves inner paths behind: drop them too.
            del self.stack[depth:]

    def _wrap(self, impl: Any, mode: Mode) -> None:
        """Run the forward of every wrapped path through ``impl.checkpoint``.  A reentrant
        checkpoint gets keyword arguments bound with ``functools.partial`` (as transformers binds
        them): only positional tensors are its inputs."""
        modules = dict(self.made.module.named_modules())
        reentrant = mode is Mode.REENTRANT
        for path in self.wrapped:
            sub = modules[path]

            def checkpointed(*args: Any, _forward: Callable = sub.forward, **kwargs: Any) -> Any:
                if reentrant and kwargs:
                    return impl.checkpoint(functools.partial(_forward, **kwargs), *args, reentrant=True,
                                           tracker=self.tracker)
                return impl.checkpoint(_forward, *args, reentrant=reentrant, tracker=self.tracker, **kwargs)

            sub.forward = checkpointed  # type: ignore[method-assign]

    def close(self) -> None:
        """Give every submodule its own ``forward`` (and checkpoint function) back."""
        for sub, attribute, own in self._originals:
            if own is None:
                sub.__dict__.pop(attribute, None)
            else:
                setattr(sub, attribute, own)

    # -- the Step protocol

    def begin_iteration(self, iteration: int) -> None:
        self.record.log.start(iteration)
        for leaf in (*_tensors(self.inputs), *self.params.values()):
            leaf.grad = None

    def forward(self) -> torch.Tensor:
        self.record.log.phase = FORWARD
        with DrawLog(self.record.log, self.stack, self.busy):
            inputs = self.inputs
            out = (self.made.module(**inputs) if isinstance(inputs, dict)
                   else self.made.module(*inputs) if isinstance(inputs, (tuple, list))
                   else self.made.module(inputs))
        outputs = [t for t in _tensors(out) if t.is_floating_point()]
        for n, t in enumerate(outputs):
            self.record.log.record(f"output.{n}", t)
        if self.made.loss is not None:
            loss = self.made.loss(out)
        else:
            if self.loss_weights is None:
                gen = torch.Generator().manual_seed(0)
                self.loss_weights = [torch.rand(t.shape, generator=gen).to(t.device) for t in outputs]
            loss = sum(((t.float() * w).sum() for t, w in zip(outputs, self.loss_weights)),
                       torch.zeros((), device=self.device))
        self.record.log.record(LOSS, loss)
        return loss

    def between(self, cpu: bool = True, device: bool = True) -> None:
        """Module mode draws nothing between forward and backward."""

    def draws_between(self) -> bool:
        return False

    def backward(self, loss: torch.Tensor) -> None:
        self.record.log.phase = RECOMPUTE
        with DrawLog(self.record.log, self.stack, self.busy):
            loss.backward()

    def collect(self, iteration: int) -> None:
        captured = self.recomputed.get(-2)  # capture.run_single / run_separate capture as iteration -2
        if iteration not in self.recomputed and captured is not None:
            self.recomputed[iteration] = set(captured)
        grads = {f"input.{n}": t.grad for n, t in enumerate(_tensors(self.inputs)) if t.requires_grad}
        grads.update({f"param.{name}": p.grad for name, p in self.params.items()})
        buffers = {name: b for name, b in self.made.module.named_buffers()}
        self.keep(iteration, grads, buffers)

    def checkpointed_roots(self, iteration: int) -> list[str]:
        """The paths run again in backward in `iteration` none of whose parents was: the
        submodules the model's own checkpointing recomputed."""
        ran = self.recomputed.get(iteration, set())
        return sorted(p for p in ran if not any(q != p and _under(p, q) for q in ran))


@dataclass
class ModuleResult:
    """What `run_module` found.

    `outcome`: pass, rounding (no RNG oracle failed; each differing gradient or output is within
    rounding of the reference: `draws.rounding_only`), mismatch, error (the impl raised: `error`,
    `traceback`, and the `warnings` the run gave), unsupported (the impl declared a limit:
    `reason`) or skipped (no verdict: `reason`).  `checkpointed`: the submodule paths
    checkpointed (wrapped, or as built); `not_wrapped` the containers a ``--wrap`` pattern
    matched, which have no forward to checkpoint (`runnable_wrapped`);
    `draws`: every draw name the reference made (in first-seen order); `draws_per_forward` the
    draws of iteration 0's forward; `first_divergent` the first draw that went wrong, else
    `diagnosis` says what differs with no draw to blame.  `transformers`: the version of
    transformers the model comes from, and `checkpointing_api` the method its own checkpointing
    was turned on with (`harness.checkpoint.hf`; as-built only)."""

    outcome: str
    checkpointed: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    draws: list[str] = field(default_factory=list)
    draws_per_forward: int = 0
    first_divergent: str | None = None
    diagnosis: str = ""
    iterations: int = 2
    reason: str = ""
    error: str = ""
    traceback: str = ""
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    must_support: bool = False  # unsupported, by an impl that must run everything, with no limit declared
    transformers: str = ""  # the transformers version the model's classes come from ('' for none)
    checkpointing_api: str = ""  # the method that turned the build under test's checkpointing on (`hf.used_api`)
    not_wrapped: list[str] = field(default_factory=list)  # matched by --wrap, left out: containers with no forward

    @property
    def passed(self) -> bool:
        """Pass, or rounding (not a failure unless asked: `module --rounding-fails`)."""
        return self.outcome in ("pass", "rounding")


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the module's parameters and buffers."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _output_names(record: RunRecord) -> list[str]:
    """The names the run recorded its outputs under, and the loss."""
    return sorted({n for (_, n, _) in record.log.masks if n.startswith("output.")}) + [LOSS]


def _draw_names(record: RunRecord, iteration: int | None = None) -> list[str]:
    """The forward draw names of `record` (of one iteration, or of all), in first-seen order."""
    return list(dict.fromkeys(n for (it, n, ph) in record.log.masks
                              if ph == FORWARD and (iteration is None or it == iteration)
                              and not n.startswith("output.") and n != LOSS))


# The seeded aten ops a model draws with -> the matrix's op of the same kind, for an impl's
# `supports` and `limit` (which read a case's program).
ATEN_OPS = {
    "aten::native_dropout": Op.NATIVE_DROPOUT, "aten::bernoulli_": Op.BERNOULLI, "aten::bernoulli": Op.BERNOULLI,
    "aten::rand": Op.RAND, "aten::randn": Op.RANDN, "aten::rand_like": Op.RAND_LIKE, "aten::randn_like": Op.RANDN_LIKE,
    "aten::randint": Op.RANDINT,
    "aten::normal_": Op.NORMAL, "aten::uniform_": Op.UNIFORM, "aten::multinomial": Op.MULTINOMIAL,
    "aten::randperm": Op.RANDPERM, "aten::poisson": Op.POISSON, "aten::exponential_": Op.EXPONENTIAL,
    "aten::_scaled_dot_product_efficient_attention": Op.SDPA_EFFICIENT,
    "aten::_scaled_dot_product_flash_attention": Op.SDPA_FLASH,
    "aten::_scaled_dot_product_cudnn_attention": Op.SDPA_CUDNN,
}


def module_case(mode: Mode, capture: Capture, device: torch.device, draws: list[str], keyword: bool,
                tracked: bool, nested: bool = False) -> Case:
    """The matrix case that says what an impl must handle to run this model: `mode` and
    `capture`, one region holding a site per kind of RNG op the model drew (`ATEN_OPS`; ops
    of no kind there are left out, and a model drawing none gets a site that draws nothing), passed
    by keyword where a wrapped forward was given keyword arguments, in the mixed layout when the
    model forks its own tracker streams (else the default layout); with `nested` (a wrapped
    submodule inside another), that region holds a second one, so an impl that cannot nest its
    regions declares the run unsupported instead of failing it."""
    found = {ATEN_OPS[op] for op in map(draw_op, draws) if op in ATEN_OPS}
    half = {Op.SDPA_FLASH, Op.SDPA_CUDNN}  # half-only kernels
    sites = [f"{op.value}.bf16" if op in half else op.value for op in Op if op in found] or [Op.DROPOUT_P0.value]
    body = "+".join(sites)
    spec = f"{'keyword' if keyword else ''}({body}+({body}))" if nested else f"{'keyword' if keyword else ''}({body})"
    try:
        program = parse_program(spec)
    except ProgramError as exc:  # a harness bug, not the user's: say what was built
        raise AssertionError(f"module mode built an invalid spec {spec!r}: {exc}") from None
    return Case(mode, Layout.MIXED if tracked else Layout.DEFAULT, capture, program, Interleave.NONE,
                Device(device.type))


def run_factory(factory: Callable[..., Any], factory_path: str, impl: Any, device: str = "cpu",
                capture: Capture = Capture.EAGER, mode: Mode = Mode.NONREENTRANT, wrap: list[str] | None = None,
                iterations: int = 2, name: str | None = None, start: float | None = None) -> ModuleResult:
    """Run `factory`'s module (`factory_path` names it) under `impl` (or, for `AsBuilt`, its own
    checkpointing) against the same module without checkpointing (both built from the same RNG
    states) and compare them bit for bit (module doc).  Bad input is a `ModuleError`; everything
    else is a result: a model that without checkpointing raises or does not reproduce itself, or an
    as-built model that recomputed nothing, is ``skipped`` ("cannot judge"), a declared limit
    ``unsupported``, an impl that raises ``error``.  `start`: the `time.perf_counter()` the run's
    duration counts from (the front's, before it loaded the factory; default now)."""
    start = time.perf_counter() if start is None else start
    as_built = bool(getattr(impl, "as_built", False))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.init()
    result = ModuleResult("pass", iterations=iterations)
    seen: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # In a copy of the context: context-local state a model or its checkpoint leaves behind
            # (torch_remat 0.2.2's region variable after a hook raised) stays with this run.
            contextvars.copy_context().run(
                _judge, factory, factory_path, impl, name or getattr(impl, "name", "?"), dev, capture, mode, wrap,
                iterations, as_built, result)
    except ModuleError:
        raise
    except NotReproducible as exc:
        result.outcome, result.reason = "skipped", f"cannot judge: {exc}"
    except (Exception, SystemExit) as exc:  # the impl raised: a result, not a crash
        result.outcome, result.error = "error", one_line(exc)
        result.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:])
    finally:
        seen = list(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
    if result.outcome == "error":
        result.warnings = seen[:3]  # torch's warnings often say why (e.g. no input requires grad)
    result.duration_s = time.perf_counter() - start
    return result


def _judge(factory: Callable[..., Any], factory_path: str, impl: Any, name: str, dev: torch.device,
           capture: Capture, mode: Mode, wrap: list[str] | None, iterations: int, as_built: bool,
           result: ModuleResult) -> None:
    """The three builds and runs, the limit check and the oracles, into `result`."""
    # On CUDA, torch's deterministic mode (warn-only), as for the attention ops of the matrix: a
    # user's attention backward must not accumulate in a run-to-run order the checkpoint is not to blame for.
    deterministic = ops.determinism([Op.SDPA_EFFICIENT] if dev.type == "cuda" else [])
    with preserved_global_rng(), deterministic:
        # The reference, a second reference, the build under test: each tracker is made just
        # before its build and run, because some impls' trackers are one global object
        # (Megatron-core's, DeepSpeed's) that making a tracker resets.
        first_state: dict[str, torch.Tensor] = {}
        wrapped: list[str] = []
        outputs: list[str] = []  # the output names and the loss, as the reference recorded them
        sessions: list[ModuleSession] = []
        for role in ("reference", "second reference", "under test"):
            tracker = new_tracker(impl, dev)
            made = build(factory, factory_path, dev, tracker, checkpointing=as_built and role == "under test")
            if role == "under test":
                result.checkpointing_api = hf.used_api(made.module)
            if not sessions:
                result.transformers = hf.transformers_version(made.module)
                first_state = _state(made.module)  # before a forward updates any buffer
                if not as_built:  # bad patterns: bad input, before any run
                    patterns = wrap or [""]
                    wrapped, result.not_wrapped = runnable_wrapped(made.module, wrapped_paths(made.module, patterns),
                                                                   patterns)
            elif not _same_state(first_state, _state(made.module)):
                raise ModuleError(f"factory {factory_path} is not deterministic: builds after the same seeding "
                                  "have different parameters or buffers")
            if role == "under test" and not as_built:
                reference = sessions[0]
                keyword = mode is Mode.NONREENTRANT and bool(reference.keywords & set(wrapped))
                case = module_case(mode, capture, dev, _draw_names(reference.record), keyword,
                                   takes_tracker(factory), nested=_nests(wrapped))
                unsupported = declared_unsupported(impl, name, case)
                if unsupported:
                    result.outcome, result.reason = "unsupported", unsupported
                    result.must_support = must_support(impl, case)
                    result.checkpointed = wrapped
                    return
            loss_weights = sessions[0].loss_weights if sessions else None
            session = ModuleSession(made, tracker, dev, impl, mode, wrapped if role == "under test" else [],
                                    loss_weights=loss_weights)
            try:
                execute(capture, session, iterations)
            except (Exception, SystemExit) as exc:
                if role == "under test":
                    raise  # the impl's (or the model's own checkpointing's) error: the outcome
                # Nothing of the impl's checkpoint ran yet: the model itself (or the tracker it
                # was given) cannot run like this, and no verdict on the checkpoint can be had.
                # Where it raised is kept: the line alone does not say whose code it was.
                result.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:])
                where = raised_in(exc)
                raise NotReproducible(
                    f"the model without checkpointing raised under {capture.value} capture, so no oracle "
                    f"can judge the checkpoint: {one_line(exc)} (raised in {where or 'torch'}: the model's own "
                    "code or a library it calls, or the impl's tracker it was given)") from None
            finally:
                session.close()
            sessions.append(session)
            if role == "second reference":
                outputs = _output_names(sessions[0].record)
                difference = reproduction_difference(sessions[0].record, session.record, outputs, iterations)
                if difference:
                    raise NotReproducible(
                        f"{factory_path}: the model without checkpointing is not bit-reproducible here, so no "
                        f"oracle can judge the checkpoint: a second identical run differs ({difference}); make its "
                        "ops deterministic (torch.use_deterministic_algorithms, the library's own switches) and "
                        "run again")
    reference, _, under_test = sessions
    result.draws = _draw_names(reference.record)
    result.draws_per_forward = sum(len(reference.record.draws(0, n, FORWARD)) for n in _draw_names(reference.record, 0))
    if as_built:
        roots = {it: under_test.checkpointed_roots(it) for it in range(iterations)}
        result.checkpointed = sorted({p for paths in roots.values() for p in paths})
        if not result.checkpointed:
            result.outcome = "skipped"
            result.reason = (f"cannot judge: the build with {CHECKPOINTING_PARAMETER}=True recomputed no submodule in "
                             "backward, so its checkpointing never ran (is it on in training mode, for these inputs?)")
            return
    else:
        roots = {it: wrapped for it in range(iterations)}
        result.checkpointed = wrapped

    def sites(it: int) -> list[str]:
        """The reference's draws of iteration `it` inside a checkpointed submodule: only a draw
        the reference made in that iteration must be redrawn by its recompute (layer drop)."""
        return [n for n in _draw_names(reference.record, it) if any(_under(draw_path(n), r) for r in roots[it])]

    result.mismatches = check(reference.record, under_test.record, sites, iterations, outputs, drawing=result.draws)
    result.outcome = "mismatch" if result.mismatches else "pass"
    if result.outcome == "pass" and not result.draws:
        # Equal bits with nothing random drawn says nothing about RNG under checkpointing.
        result.outcome = "skipped"
        result.reason = (f"nothing random to judge: the model drew no random numbers in {iterations} iterations "
                         "(dropout 0, eval mode, or no RNG op); outputs and gradients matched")
        return
    result.first_divergent = first_divergent_draw(result.mismatches, result.draws)
    frozen = reference.record.log.frozen | under_test.record.log.frozen
    if frozen and frozen_only(result.mismatches, frozen):
        # the model draws on the host inside the captured step: frozen at capture in the
        # reference too, so the reference is no oracle for the checkpoint here
        result.outcome = "skipped"
        how = (f"and the runs froze different values ({result.first_divergent})" if result.first_divergent else
               "and every replay repeats it (fresh-randomness), in the reference too")
        result.reason = (f"not capture-safe: {', '.join(sorted(frozen))} drew on the CPU generator during CUDA graph "
                         f"capture, so its value is frozen into the graph in the reference as much as in the "
                         f"checkpointed run, {how}; no oracle can judge the checkpoint under capture here (eager, "
                         "or a draw on the device, can)")
        return
    if result.mismatches and result.first_divergent is None:
        worst = worst_differences(result.mismatches, reference.record, under_test.record)  # once, for both
        result.diagnosis = diagnose(result.mismatches, reference.record, under_test.record, worst)
        if rounding_only(result.mismatches, reference.record, under_test.record, worst):
            # the RNG is right; the bit-exact gradient oracle saw another summation order
            result.outcome = "rounding"
