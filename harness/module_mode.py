"""Your own model under test: `python -m harness module PKG.MOD:FACTORY --impl NAME`.

``FACTORY()`` returns a `ModelCase` (or a tuple ``(module, inputs)``): an ``nn.Module`` and its
example inputs (a tensor, a tuple of positional inputs, or a dict of keyword inputs).  A factory
with a parameter named ``rng_tracker`` is given the impl's own RNG tracker object for that build
(TransformerEngine's or Megatron-core's ``CudaRNGStatesTracker``, the bundled
``RNGStatesTracker``): the factory adds the streams its model forks, as a training script would,
and hands the tracker to its layers (``get_rng_state_tracker=lambda: rng_tracker``).  The
harness adds its own tracked stream too (``model-parallel``), so a tracker the model never forks
is still checked for being left where it was.  The harness builds the module three times from the
same RNG states (the factory is called after the same seeding, each time with a fresh tracker;
the builds must have bit-identical parameters): the reference, a second reference, and the
checkpointed module.  The reference runs twice and must agree with itself bit for bit, or no
oracle can judge the model (`NotReproducible`).  It wraps the forward of every submodule whose
``named_modules()`` path matches ``--wrap`` (glob; default ``""``: the whole module) in the impl's
checkpoint, and runs both for K iterations under the capture mode asked for (the executors of
`harness.capture`).  Per iteration it compares, bit for bit, through the oracles of
`harness.oracles`:

* every RNG draw: a dispatch mode records each op tagged ``nondeterministic_seeded`` with the
  submodule path running it, in forward and in recompute, under the name ``PATH (aten::op)``, by
  what it drew (`rng_output`: dropout's mask, fused attention's Philox seed and offset);
  forward draws are compared with the reference's (``forward-mask``) and recompute draws with the
  forward's (``recompute-mask``; a draw inside a wrapped submodule that is never recomputed is a
  failure too);
* the outputs and the loss (``output``), the gradients of the inputs and of every parameter
  (``gradient``), every live stream after backward, tracker streams included (``live-stream``),
  tracker stream identity, and that forward draws change between iterations.

The loss is the sum of every floating output times a fixed random weight (from a private
generator), or the case's own ``loss(output)``.  `first_divergent_draw` names the first draw that
went wrong, in the order the draws happened.

What the draw log cannot see: RNG drawn inside a kernel that is not an aten op tagged
``nondeterministic_seeded`` (cuDNN fused attention's dropout, for one) is not a draw of the log,
though the outputs, gradients and live streams it changes are still compared.  And while the
dispatch mode is active, dynamo does not compile: a ``torch.compile``'d function inside the model
runs eagerly, in the reference and the checkpointed run alike.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from . import ops
from .capture import execute
from .checkpoint.stash import is_seeded
from .impls import one_line
from .cases import Capture, Layout, Mode
from .compare import Mismatch
from .oracles import check
from .programs import Op
from .records import FORWARD, LOSS, RECOMPUTE, MaskLog, RunRecord
from .runner import NotReproducible, TrackedRun, reproduction_difference
from .streams import preserved_global_rng, stream_objects
from .workload import make_tracker_streams, seed_all


class ModuleError(ValueError):
    """Bad input to module mode (a factory that does not import, raises or returns the wrong
    thing; a --wrap pattern that matches nothing); the message is one line for the user."""


TRACKER_PARAMETER = "rng_tracker"  # the factory parameter that receives the impl's tracker


@dataclass
class ModelCase:
    """What a factory returns: the module, its example inputs (a tensor, a tuple of positional
    inputs or a dict of keyword inputs) and optionally the loss of its output."""

    module: torch.nn.Module
    inputs: Any
    loss: Callable[[Any], torch.Tensor] | None = None


def load_factory(path: str) -> Callable[[], Any]:
    """The factory ``PKG.MOD:FACTORY`` names; `ModuleError` (one line) when it cannot be had."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ModuleError(f"bad factory {path!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise ModuleError(f"cannot import {module_name!r} for factory {path!r}: {one_line(exc)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModuleError(f"{path}: module {module_name!r} has no callable {attr!r}")
    return factory


def takes_tracker(factory: Callable[..., Any]) -> bool:
    """True when `factory` has a parameter named ``rng_tracker`` (it is then given the impl's tracker)."""
    try:
        return TRACKER_PARAMETER in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature takes no tracker
        return False


def new_tracker(impl: Any, device: torch.device) -> Any:
    """A fresh tracker of `impl` (None where the impl has none) with the harness's tracked stream."""
    make_tracker = getattr(impl, "make_tracker", None)
    tracker = make_tracker(device) if make_tracker is not None else None
    make_tracker_streams(tracker, Layout.TRACKED)  # the tracked stream, as the matrix has it
    return tracker


def build(factory: Callable[..., Any], path: str, device: torch.device, tracker: Any = None) -> ModelCase:
    """Call `factory` after seeding every generator (so two builds are the same), passing it the
    upstream object of `tracker` when it takes ``rng_tracker``, and check what it returns; the
    module (in training mode) and its inputs are moved to `device`."""
    kwargs = {}
    if takes_tracker(factory):
        if tracker is None:
            raise ModuleError(f"factory {path} takes {TRACKER_PARAMETER}, but this impl has no RNG tracker")
        kwargs[TRACKER_PARAMETER] = getattr(tracker, "real", tracker)  # the upstream object, not the harness's view
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


def wrapped_paths(module: torch.nn.Module, patterns: list[str]) -> list[str]:
    """The submodule paths (``named_modules()`` names, '' the whole module) matching any pattern;
    `ModuleError` for a pattern that matches nothing."""
    names = [name for name, _ in module.named_modules()]
    found: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            raise ModuleError(f"--wrap {pattern!r} matches no submodule; paths: {shown}")
        found += [h for h in hits if h not in found]
    return found


# Outputs of a seeded op that identify its draw exactly: the Philox seed and offset that fused
# attention kernels return (their dropout is drawn inside the kernel).
_RNG_RETURNS = ("philox_seed", "philox_offset", "rng_state")


def rng_output(func: Any, out: Any) -> torch.Tensor | None:
    """The part of a seeded op's output that is its draw: the Philox seed and offset where the
    op returns them (fused attention), else its boolean mask where it returns one (dropout's),
    else its first tensor output (rand, bernoulli_, ...).  Recording the draw, not a value computed
    from it, keeps a numerical difference upstream from reading as a divergent draw."""
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    names = [r.name for r in func._schema.returns]
    seeds = [t for name, t in zip(names, outputs) if name in _RNG_RETURNS and isinstance(t, torch.Tensor)]
    seeds = [t for t in seeds if t.device == seeds[0].device] if seeds else []
    if seeds:
        return torch.cat([t.detach().reshape(-1).to(torch.int64) for t in seeds])
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    masks = [t for t in tensors if t.dtype == torch.bool]
    return masks[0] if masks else (tensors[0] if tensors else None)


class DrawLog(TorchDispatchMode):
    """Records every op tagged ``nondeterministic_seeded`` (its `rng_output`) into a `MaskLog`,
    under ``PATH (aten::op)``: the submodule path on top of `stack` when it ran.

    Logs may nest (the session's around forward and backward, one inside each wrapped forward, so
    it sits inside whatever dispatch mode the checkpoint enters for its recompute and sees a draw
    the checkpoint hands back from a stash instead of redrawing); `busy` (shared by one session's
    logs) makes the innermost one the only one that records an op.  An op with no submodule
    running is not recorded in backward: it is a backward kernel (attention's backward is
    tagged seeded too), not a recompute's draw."""

    def __init__(self, log: MaskLog, stack: list[str], busy: list[bool]) -> None:
        super().__init__()
        self.log, self.stack, self.busy = log, stack, busy

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.busy[0] or not is_seeded(func):
            return func(*args, **(kwargs or {}))
        self.busy[0] = True  # an outer log sees this op next: it must not record it again
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.busy[0] = False
        if self.stack or self.log.phase == FORWARD:
            drawn = rng_output(func, out)
            if drawn is not None:
                path = self.stack[-1] if self.stack else ""
                self.log.record(f"{path or '<module>'} ({func._schema.name})", drawn)
        return out


def draw_path(name: str) -> str:
    """The submodule path of a draw name ``PATH (aten::op)``."""
    return name.rsplit(" (", 1)[0]


class ModuleSession(TrackedRun):
    """One run of the module (reference, or checkpointed through `impl`), as the executors of
    `harness.capture` drive it (the `capture.Step` protocol)."""

    def __init__(self, made: ModelCase, tracker: Any, device: torch.device, impl: Any, mode: Mode,
                 wrapped: list[str], loss_weights: list[torch.Tensor] | None = None) -> None:
        """`tracker`: the one `made` was built with (`new_tracker`); `wrapped`: the submodule paths
        whose forward `impl` checkpoints (none: the reference)."""
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
        self._hooks = self._track_paths()
        self._wrap(impl, mode)

    # -- set-up

    def _track_paths(self) -> list[Any]:
        def enter(name: str) -> Callable[..., None]:
            return lambda module, args: self.stack.append(name)  # returns None: inputs unchanged

        def leave(module: Any, args: Any, output: Any) -> None:  # None: the output is left as it is
            self.stack.pop()

        hooks = []
        for name, sub in self.made.module.named_modules():
            hooks.append(sub.register_forward_pre_hook(enter(name)))
            hooks.append(sub.register_forward_hook(leave))
        return hooks

    def _wrap(self, impl: Any, mode: Mode) -> None:
        modules = dict(self.made.module.named_modules())
        for path in self.wrapped:
            sub = modules[path]
            original = sub.forward

            def inner(*args: Any, _original: Callable = original, _path: str = path, **kwargs: Any) -> Any:
                depth = len(self.stack)
                self.stack.append(_path)  # the recompute calls this, not the module's __call__
                try:
                    with DrawLog(self.record.log, self.stack, self.busy):  # inside the checkpoint's own modes
                        return _original(*args, **kwargs)
                finally:
                    # A recompute stopped early (torch's non-reentrant checkpoint raises inside a
                    # submodule's forward) skips those submodules' forward hooks: drop their paths too.
                    del self.stack[depth:]

            def forward(*args: Any, _inner: Callable = inner, **kwargs: Any) -> Any:
                return impl.checkpoint(_inner, *args, reentrant=mode is Mode.REENTRANT, tracker=self.tracker, **kwargs)

            sub.forward = forward  # type: ignore[method-assign]

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()

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
        grads = {f"input.{n}": t.grad for n, t in enumerate(_tensors(self.inputs)) if t.requires_grad}
        grads.update({f"param.{name}": p.grad for name, p in self.params.items()})
        self.keep(iteration, grads)


@dataclass
class ModuleResult:
    """What `run_module` found: the mismatches (oracle order), the draws it saw and the first
    divergent draw (None when the draws agree)."""

    mismatches: list[Mismatch]
    wrapped: list[str]
    draws: list[str]
    first_divergent: str | None
    iterations: int

    @property
    def passed(self) -> bool:
        return not self.mismatches


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the module's parameters and buffers."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _output_names(record: RunRecord) -> list[str]:
    """The names the run recorded its outputs under, and the loss."""
    return sorted({n for (_, n, _) in record.log.masks if n.startswith("output.")}) + [LOSS]


def run_module(factory_path: str, impl: Any, device: str = "cpu", capture: Capture = Capture.EAGER,
               mode: Mode = Mode.NONREENTRANT, wrap: list[str] | None = None, iterations: int = 2) -> ModuleResult:
    """Run the factory's module under `impl` against the same module without checkpointing (both
    built from the same RNG states) and compare them bit for bit (module doc).  Bad input is a
    `ModuleError`; a model that does not reproduce itself without checkpointing is
    `NotReproducible` (no verdict); anything the impl raises propagates to the caller."""
    factory = load_factory(factory_path)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.init()
    # On CUDA, torch's deterministic mode (warn-only), as for the attention ops of the matrix: a
    # user's attention backward must not accumulate in a run-to-run order the checkpoint is not to blame for.
    deterministic = ops.determinism([Op.SDPA_EFFICIENT] if dev.type == "cuda" else [])
    with preserved_global_rng(), deterministic:
        # The reference, a second reference, the checkpointed module: each tracker is made just
        # before its build and run, because some impls' trackers are one global object
        # (Megatron-core's, DeepSpeed's) that making a tracker resets.
        first_state: dict[str, torch.Tensor] = {}
        wrapped: list[str] = []
        outputs: list[str] = []  # the output names and the loss, as the reference recorded them
        sessions: list[ModuleSession] = []
        for role in ("reference", "second reference", "checkpointed"):
            tracker = new_tracker(impl, dev)
            made = build(factory, factory_path, dev, tracker)
            if not sessions:
                first_state = _state(made.module)  # before a forward updates any buffer
                wrapped = wrapped_paths(made.module, wrap or [""])  # bad patterns: bad input, before any run
            elif not _same_state(first_state, _state(made.module)):
                raise ModuleError(f"factory {factory_path} is not deterministic: builds after the same seeding "
                                  "have different parameters or buffers")
            loss_weights = sessions[0].loss_weights if sessions else None
            session = ModuleSession(made, tracker, dev, impl, mode, wrapped if role == "checkpointed" else [],
                                    loss_weights=loss_weights)
            execute(capture, session, iterations)
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
    reference, _, checkpointed = sessions
    draws = [n for (it, n, ph) in reference.record.log.masks if it == 0 and ph == FORWARD
             and not n.startswith("output.") and n != LOSS]
    inside = [n for n in draws if any(_under(draw_path(n), path) for path in wrapped)]
    mismatches = check(reference.record, checkpointed.record, inside, iterations, outputs, drawing=draws)
    return ModuleResult(mismatches, wrapped, draws, first_divergent_draw(mismatches, draws), iterations)


def _under(path: str, wrapped: str) -> bool:
    """True when submodule `path` is `wrapped` or inside it."""
    if path == "<module>":
        return wrapped == ""
    return wrapped == "" or path == wrapped or path.startswith(wrapped + ".")


def first_divergent_draw(mismatches: list[Mismatch], draws: list[str]) -> str | None:
    """'recompute draw 3 of encoder.layers.1.dropout1 (aten::native_dropout): 2011/4096 elements
    differ (iteration 0)': the first draw mismatch in the order the run drew (iteration, then
    forward before recompute, then draw order), or None."""
    order = {name: n for n, name in enumerate(draws)}
    candidates = []
    for m in mismatches:
        if m.oracle not in ("forward-mask", "recompute-mask"):
            continue
        name, _, which = m.subject.partition(" (recompute ")
        name = name if which else m.subject
        if name not in order:
            continue
        k = int(which.split(" of ")[0]) if which else 1
        candidates.append(((m.iteration, m.oracle == "recompute-mask", order[name], k), m, name, k))
    if not candidates:
        return None
    _, m, name, k = min(candidates, key=lambda c: c[0])
    phase = "recompute" if m.oracle == "recompute-mask" else "forward"
    path, _, op = name.rpartition(" (")
    what = f"{m.count}/{m.total} elements differ" if m.total else m.detail
    return f"{phase} draw {k} of {path} ({op.rstrip(')')}): {what} (iteration {m.iteration})"


def _head(factory: str, impl: str, device: str, capture: Capture, mode: Mode) -> str:
    return f"{impl} {factory} ({device}, {capture.value}, {mode.value})"


def summary(factory: str, impl: str, device: str, capture: Capture, mode: Mode, result: ModuleResult) -> str:
    """The text `harness module` prints: the verdict, the first divergent draw, then the
    mismatches grouped by oracle (as `repro` shows them)."""
    lines = [f"{_head(factory, impl, device, capture, mode)}: {'pass' if result.passed else 'mismatch'}",
             f"wrapped: {', '.join(repr(p) for p in result.wrapped)}; {len(result.draws)} RNG draws per forward, "
             f"{result.iterations} iterations"]
    if result.first_divergent:
        lines.append(f"first divergent draw: {result.first_divergent}")
    by_oracle: dict[str, list[str]] = {}
    for m in result.mismatches:
        by_oracle.setdefault(m.oracle, []).append(m.message())
    for oracle, found in by_oracle.items():
        lines += ["", f"{oracle} ({len(found)}):", *(f"  {line}" for line in found)]
    return "\n".join(lines)


def write_report(directory: Path, factory: str, impl: str, device: str, capture: Capture, mode: Mode,
                 result: ModuleResult) -> None:
    """``result.json`` (verdict, first divergent draw, every mismatch) and ``summary.md`` in `directory`."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    data = {"factory": factory, "impl": impl, "device": device, "capture": capture.value, "mode": mode.value,
            "outcome": "pass" if result.passed else "mismatch", "wrapped": result.wrapped,
            "draws": result.draws, "first_divergent_draw": result.first_divergent,
            "iterations": result.iterations, "mismatches": [m.to_dict() for m in result.mismatches]}
    (directory / "result.json").write_text(json.dumps(data, indent=1) + "\n")
    text = summary(factory, impl, device, capture, mode, result)
    (directory / "summary.md").write_text(f"# harness module\n\n```\n{text}\n```\n")


SCRIPT = '''"""Reproduces `python -m harness module {factory} --impl {impl}` ({device}, {capture}, {mode}).

It imports your factory and runs it through ckpt-rng-harness's module mode; exit 1 when the
checkpointed module still differs from the one without checkpointing, 0 when it agrees.
"""

import sys

from harness.cases import Capture, Mode
from harness.impls import load
from harness.module_mode import run_module, summary

FACTORY = {factory!r}
IMPL = {impl!r}

result = run_module(FACTORY, load(IMPL), device={device!r}, capture=Capture({capture!r}), mode=Mode({mode!r}),
                    wrap={wrap!r}, iterations={iterations!r})
print(summary(FACTORY, IMPL, {device!r}, Capture({capture!r}), Mode({mode!r}), result))
sys.exit(0 if result.passed else 1)
'''


def script(factory: str, impl: str, device: str, capture: Capture, mode: Mode, wrap: list[str] | None,
           iterations: int) -> str:
    """A Python script that repeats this module run (it imports the factory through the harness)."""
    return SCRIPT.format(factory=factory, impl=impl, device=device, capture=capture.value, mode=mode.value,
                         wrap=wrap or [""], iterations=iterations)
