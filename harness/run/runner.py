"""Run one case for one implementation: reference run, checkpointed run, oracles -> `CaseResult`."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..check.oracles import check
from ..check.records import FORWARD, RECOMPUTE, WARMUP, MaskLog, RunRecord
from ..check.reference import check_reference
from ..errors import HarnessError
from ..model import ops
from ..model.cases import Case, Device, Interleave, Layout, Mode, kernel_auto_attention, parse_case_id
from ..results import OUTSIDE_IMPL, CaseRecord, Mismatch, Outcome
from . import ambient
from .capture import REGISTER_WARNINGS, execute
from .compiled import run_compiled
from .references import REFERENCES, Reference, tracker_kind
from .streams import preserved_global_rng, snapshot_streams, stream_objects
from .workload import CheckpointFn, RunNames, Tensors, Workload, alias_problem, make_tracker_streams, seed_all

# The observed fact a case's CUDA graph registrations warned this many times (torch >= 2.14).
REGISTER_WARNINGS_FACT = "capture.register_warnings"

# The record's field saying how many reference runs its case made (`CaseResult.reference_runs`).
REFERENCE_RUNS = "reference_runs"

# K >= 2: the second iteration shows what a leaked stream advance does next (spec programs may
# ask for more: `Program.iterations`).
ITERATIONS = 2


@dataclass
class CaseResult:
    """The outcome of one case for one impl; `to_dict` is the stable results.jsonl schema."""

    case: Case
    impl: str
    outcome: Outcome
    impl_version: str | None = None
    reason: str = ""  # why unsupported / skipped
    error: str = ""  # "Type: message" when the impl raised
    traceback: str = ""
    mismatches: list[Mismatch] = field(default_factory=list)
    duration_s: float = 0.0
    iterations: int = ITERATIONS
    timelines: dict[str, list] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # setup / reference / checkpointed / compare
    # With `run(keep_masks=True)`: each run's RNG outputs ("reference", "checkpointed": MaskLog),
    # for the cross-rank oracle; not part of the record.
    masks: dict[str, Any] = field(default_factory=dict, repr=False)
    # A run of several ranks (`harness.run.ranks`): how many, and per rank what differed.
    ranks: int = 1
    rank_layout: str = ""  # `RankContext.label`: tp2, tp2xcp1xdp2
    # What the run saw the installed torch do, for the models (`models.Machine`): what a compiled
    # run's backward graph redraws (`partition_watch`).  Kept in the record as its machine facts.
    observed: dict[str, Any] = field(default_factory=dict)
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    # How many reference runs this case made: 0 where it reused one made for another impl
    # (`REFERENCES`), 2 with the reproducibility check's second run; None where none was due
    # (skipped, unsupported, or an error before the reference).
    reference_runs: int | None = None

    @property
    def case_id(self) -> str:
        return self.case.id

    def summary(self) -> str:
        """One line per mismatch (or the error / reason), for pytest failures and terminals."""
        if self.outcome is Outcome.MISMATCH:
            return "\n".join(m.message() for m in self.mismatches)
        if self.outcome in (Outcome.ERROR, Outcome.CRASH, Outcome.TIMEOUT):
            return self.error
        return self.reason

    def record(self) -> CaseRecord:
        """The result as a results.jsonl record, not yet judged (`execution.judged_record` judges it)."""
        record = CaseRecord(
            self.case.id, self.impl, self.outcome, impl_version=self.impl_version, axes=self.case.axis_values(),
            reason=self.reason, error=self.error, traceback=self.traceback, mismatches=list(self.mismatches),
            duration_s=self.duration_s, timings=dict(self.timings), iterations=self.iterations)
        if self.ranks > 1:
            record.extra.update(ranks=self.ranks, rank_layout=self.rank_layout or f"tp{self.ranks}",
                                per_rank=list(self.per_rank))
        if self.observed:  # (the judge moves what a model asked of it into machine_facts)
            record.extra["observed"] = dict(self.observed)
        if self.reference_runs is not None:
            record.extra[REFERENCE_RUNS] = self.reference_runs
        return record

    def to_dict(self) -> dict[str, Any]:
        """`record()` in its JSON form (what an isolated worker sends back)."""
        return self.record().to_json()


def result_from_dict(data: dict[str, Any]) -> CaseResult:
    """Rebuild a `CaseResult` from its `to_dict` form (e.g. sent back by an isolated worker)."""
    record = CaseRecord.from_json(data)
    return CaseResult(
        parse_case_id(record.case_id), record.impl, record.outcome, impl_version=record.impl_version,
        reason=record.reason, error=record.error, traceback=record.traceback, mismatches=record.mismatches,
        duration_s=record.duration_s, iterations=record.iterations, timings=record.timings,
        observed=dict(record.extra.get("observed") or {}), reference_runs=record.extra.get(REFERENCE_RUNS),
    )


def environment_skip(case: Case) -> str | None:
    """Why this environment cannot run `case`, or None: no CUDA device for a cuda case, or an
    attention backend this GPU or torch build does not offer for the program's input."""
    if case.device is Device.CUDA and not torch.cuda.is_available():
        return "no CUDA device is visible"
    for op, dtype in (*case.program.op_dtypes(), *kernel_auto_attention(case.program)):
        reason = ops.unrunnable(op, dtype, case.shape, case.device.value)
        if reason:
            return reason
    return None


class _Clock:
    """Splits a case's time into named laps (seconds), for the benchmark."""

    def __init__(self, laps: dict[str, float]) -> None:
        self.laps, self.last = laps, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.last, 6)
        self.last = now


class NotReproducible(HarnessError):
    """Two identical reference runs differ: no oracle can judge the case on this machine."""


class NoTracker(HarnessError):
    """The impl has no tracker, and the case's layout needs one: the case is unsupported."""


class AdapterFault(HarnessError, RuntimeError):
    """An adapter broke its contract (returned the wrong thing, raised in `supports`); one line
    naming the adapter and what it did."""


class TrackedRun:
    """What every run the executors drive shares (a case's `RunSession`, module mode's session):
    its tracker and that tracker's initial states, its `record`; reseeding in place, the
    generators to register with CUDA graphs, and the per-iteration copy of what the oracles read."""

    tracker: Any
    initial_tracker_states: dict
    record: RunRecord

    def reseed(self) -> None:
        """Put every stream back to the run's initial state, in place (graph registrations hold)."""
        seed_all()
        if self.tracker is not None:
            self.tracker.set_states(self.initial_tracker_states)

    def generators(self) -> list[torch.Generator]:
        return self.tracker.generators() if self.tracker is not None and hasattr(self.tracker, "generators") else []

    def keep(self, iteration: int, grads: dict[str, torch.Tensor | None],
             buffers: dict[str, torch.Tensor] | None = None) -> None:
        """File this iteration's records (out of a graph's static buffers after a replay), copies of
        `grads` and of the model's `buffers`, and every stream's state and object."""
        self.record.log.harvest(iteration)
        self.record.grads[iteration] = {k: (None if g is None else g.detach().clone()) for k, g in grads.items()}
        if buffers is not None:
            self.record.buffers[iteration] = {k: b.detach().clone() for k, b in buffers.items()}
        self.record.streams[iteration] = snapshot_streams(self.tracker)
        self.record.objects[iteration] = stream_objects(self.tracker)


class RunSession(TrackedRun):
    """One run (reference or checkpointed) of a case, as the executors in `capture` drive it."""

    def __init__(
        self,
        case: Case,
        device: torch.device,
        tensors: Tensors,
        make_tracker: Callable[[torch.device], Any] | None,
        checkpoint_with: Callable[[Any], CheckpointFn] | None,
        timeline: list | None = None,
    ) -> None:
        self.case, self.tensors = case, tensors
        seed_all()  # CPU and every CUDA device
        self.tracker = None
        if case.layout is not Layout.UNTRACKED and make_tracker is not None:
            self.tracker = make_tracker(device)
            if self.tracker is None:
                raise NoTracker(f"layout {case.layout.value!r} needs a tracker; this impl has none")
            make_tracker_streams(self.tracker, case.layout)
        self.initial_tracker_states = self.tracker.get_states() if self.tracker is not None else {}
        self.x, self.weights = tensors.fresh_leaves()
        self.record = RunRecord(MaskLog(), objects_before=stream_objects(self.tracker))
        checkpoint = checkpoint_with(self.tracker) if checkpoint_with else None
        watch = self.record.watch.add if checkpoint is None else None  # the reference is checked
        if checkpoint is None and case.layout is Layout.SHARED and self.tracker is not None:
            self.record.alias_problem = alias_problem(self.tracker, device)
        self.events = timeline
        region_event = (lambda label: self.event(f"{self.record.log.phase} {label}")) if timeline is not None else None
        self.stream_roles = ambient.StreamRoles()
        self.workload = Workload(case, device, self.tracker, self.weights, checkpoint, self.record.log.record,
                                 watch, region_event, self.ambient_point, self.record.log.mark_saved)

    def ambient_point(self, label: str) -> None:
        """File the ambient state now under `label` in the current iteration (warm-up and capture too)."""
        state = ambient.snapshot(self.stream_roles, in_backward=label.startswith("in backward"))
        self.record.ambient.setdefault(self.record.log.iteration, []).append((label, state))

    def event(self, label: str) -> None:
        """Record every stream's state under `label` (only when a timeline was asked for)."""
        log = self.record.log
        if self.events is not None and log.iteration != WARMUP:
            self.events.append((log.iteration, label, snapshot_streams(self.tracker).states))

    def begin_iteration(self, iteration: int) -> None:
        self.record.log.start(iteration)
        for leaf in (self.x, *self.weights.values()):
            leaf.grad = None

    def forward(self) -> torch.Tensor:
        self.record.log.phase = FORWARD
        self.stream_roles.anchor()
        return self.workload.forward(self.x, self.tensors.loss_weight)

    def between(self, cpu: bool = True, device: bool = True) -> None:
        self.workload.interleaved_draws(include_cpu=cpu, include_device=device)
        if device:
            self.event("after interleaved draws")

    def draws_between(self) -> bool:
        return self.case.interleave is not Interleave.NONE

    def backward(self, loss: torch.Tensor) -> None:
        self.record.log.phase = RECOMPUTE  # any site drawn from here on is a recompute
        loss.backward()
        self.ambient_point("after backward")

    def collect(self, iteration: int) -> None:
        """Copy this iteration's masks, gradients and stream states out of (static) buffers."""
        self.keep(iteration, {"input": self.x.grad, **{name: w.grad for name, w in self.weights.items()}})
        if self.events is not None:
            self.events.append((iteration, "after backward", self.record.streams[iteration].states))


def _execute(case: Case, iterations: int, timeline: list | None, *args: Any) -> RunRecord:
    """One run of `case` (`RunSession` driven by its capture mode's executor): its record."""
    session = RunSession(case, *args, timeline=timeline)
    try:
        execute(case.capture, session, iterations)
    finally:
        # The workload holds the session's bound methods and the session holds the workload: a
        # reference cycle, which kept every run's tensors (leaves, gradients, a captured graph's
        # static buffers and so its memory pool) alive until Python's cyclic collector came round.
        # On an H100 that held up to 1.1 GiB of device memory over 2000 cases (issue 42).
        session.workload = None  # type: ignore[assignment]
    return session.record


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    if isinstance(value, (tuple, list, dict)):
        items = value.values() if isinstance(value, dict) else value
        kinds = ", ".join(type(item).__name__ for item in list(items)[:4])
        return f"a {type(value).__name__} of {len(value)} ({kinds}{', ...' if len(value) > 4 else ''})"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def checked_output(name: str, out: Any, like: torch.Tensor) -> Any:
    """`out` when it is what the region returns (a tensor like its input: the regions here keep
    shape, dtype and device); else `AdapterFault` naming the adapter and what it returned."""
    if not (isinstance(out, torch.Tensor) and out.shape == like.shape and out.dtype == like.dtype
            and out.device == like.device):
        raise AdapterFault(f"adapter {name!r}: checkpoint returned {_describe(out)}, expected "
                           f"{_describe(like)} (what the region returns)")
    return out


def checkpointing(impl: Any, case: Case, name: str | None = None) -> Callable[[Any], CheckpointFn]:
    """tracker -> a ``checkpoint(fn, args, kwargs, like)`` that runs `impl` in `case`'s mode with
    that tracker (``impl.checkpoint(fn, *args, reentrant=..., tracker=..., **kwargs)``) and checks
    that what it returns is what the region returns: a tensor like `like` (`checked_output`)."""
    reentrant = case.mode is Mode.REENTRANT
    label = name or getattr(impl, "name", "?")

    def checkpoint_with(tracker: Any) -> CheckpointFn:
        def call_impl(fn: Callable[..., Any], args: tuple, kwargs: dict, like: torch.Tensor) -> Any:
            # `raised_by_impl` knows this frame by its name: what raises below it is the impl's.
            return checked_output(label, impl.checkpoint(fn, *args, reentrant=reentrant, tracker=tracker,
                                                         **kwargs), like)

        # A SAVE region of the program (`Site.save`) is the impl's to mark where it has the
        # notion (``save_region(fn, name)``, torch_remat's); for every other impl plain code.
        call_impl.save_region = getattr(impl, "save_region", None)  # type: ignore[attr-defined]
        return call_impl

    return checkpoint_with


def declared_unsupported(impl: Any, name: str, case: Case) -> str | None:
    """The impl's `supports(case)`; one that raises or answers with a non-string is a fault."""
    supports = getattr(impl, "supports", None)
    if supports is None:
        return None
    try:
        answer = supports(case)
    except (Exception, SystemExit) as exc:
        raise AdapterFault(f"adapter {name!r}: supports() raised {type(exc).__name__}: {exc}".strip()) from None
    if answer is not None and not isinstance(answer, str):
        raise AdapterFault(f"adapter {name!r}: supports() returned {_describe(answer)}, expected None or "
                           "a reason string")
    return answer or None


# The harness's own code: a frame here is not the impl's (impls/ and checkpoint/ are impls' code).
_CORE = tuple(str(Path(__file__).resolve().parents[1] / part) + os.sep for part in ("run", "check", "model"))
# torch's and the standard library's directories (module mode's `raised_in` skips their frames too)
TORCH_DIR = str(Path(torch.__file__).resolve().parent) + os.sep
STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
# torch's checkpoint and compiler machinery: only an impl brings it in (torch's checkpoint, SAC,
# checkpoint_wrapper, torch.compile), so a frame there is the impl's, not the harness's.
_TORCH_IMPL = tuple(TORCH_DIR + part for part in ("utils/checkpoint.py", "_dynamo", "_inductor", "_functorch",
                                               "distributed/algorithms/_checkpoint"))


IMPL_RAN = "_harness_raised_once_the_impl_ran"  # set on what is raised once the impl's run began


@contextlib.contextmanager
def _impl_ran() -> Iterator[None]:
    """Mark what is raised inside as raised once the impl's code ran (`raised_by_impl`)."""
    try:
        yield
    except BaseException as exc:
        setattr(exc, IMPL_RAN, True)
        raise


def raised_by_impl(exc: BaseException) -> bool:
    """Whether the impl's code took part in raising `exc`: a `HarnessError` (a message the harness
    wrote about the impl: an adapter fault, a reference that did not draw), anything raised from
    the start of the checkpointed run on (its backward runs the impl's nodes from autograd's C++
    engine, whose frames a traceback does not show, and its CUDA errors surface asynchronously,
    when the oracles read its tensors), or a traceback that
    passes through the call into ``impl.checkpoint``, through torch's checkpoint or compiler
    machinery, or through any frame outside the harness's own code, torch and the standard
    library (the adapter, its tracker, its package)."""
    if isinstance(exc, HarnessError) or getattr(exc, IMPL_RAN, False):
        return True
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = str(Path(code.co_filename).resolve()) if code.co_filename[:1] not in ("<", "") else ""
        if code.co_name == "call_impl" or not filename:
            return True
        if filename.startswith(_TORCH_IMPL) or not filename.startswith((*_CORE, TORCH_DIR, STDLIB_DIR)):
            return True
        tb = tb.tb_next
    return False


def run(case: Case, impl: Any, iterations: int | None = None, timeline: bool = False,
        name: str | None = None, keep_masks: bool = False) -> CaseResult:
    """Run `case` under `impl` against a non-checkpointed reference; never raises for impl faults.

    The reference and the checkpointed run start from identical RNG states and use the impl's own
    tracker, so the only difference between them is the checkpoint.  The reference is checked
    before it is trusted (`reference.check_reference`): a reference that did not draw as the case
    says is an error naming the adapter.  Every global generator is put back as it was
    afterwards, so cases do not depend on each other.  `name` is the impl as the user named it
    (default: the adapter's own name); it is the result's `impl`.  With `timeline`, the state of
    every stream at each region entry and exit, after the interleaved draws and after backward is
    kept in ``result.timelines`` (for `repro`; not part of the record).  An adapter that raises
    anything (SystemExit included; KeyboardInterrupt excepted) gives an `error` result; an error
    the impl's code took no part in (`raised_by_impl`) says so (`OUTSIDE_IMPL`), and no
    expectation excuses it.
    `iterations` defaults to the program's (2 for named programs).  `keep_masks`: keep both runs'
    RNG outputs in ``result.masks`` (eager and captured runs; not compiled ones).
    """
    start = time.perf_counter()
    warned_before = REGISTER_WARNINGS[0]
    iterations = iterations or case.program.iterations
    name = name or getattr(impl, "name", "?")
    fault = None
    try:
        version = getattr(impl, "version", None)
    except (Exception, SystemExit) as exc:  # reported as the case's error below
        version, fault = None, AdapterFault(f"adapter {name!r}: version raised {type(exc).__name__}: {exc}")
    result = CaseResult(case, name, Outcome.PASS, impl_version=version, iterations=iterations)
    try:
        if fault is not None:
            raise fault
        skip = environment_skip(case)
        unsupported = None if skip else declared_unsupported(impl, name, case)
        if skip or unsupported:
            result.outcome = Outcome.SKIPPED if skip else Outcome.UNSUPPORTED
            result.reason = skip or unsupported or ""
            result.duration_s = time.perf_counter() - start
            return result
        with warnings.catch_warnings():
            # torch's reentrant checkpoint warns that no input requires grad where a region's input
            # comes in a list or dict (and inside a parent's no-grad forward); the case records the
            # error that follows, so the warning, once per case, is noise here.  Module mode lets
            # it through: there it explains an error in the user's own model.
            warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
            _run_both(case, impl, name, iterations, timeline, result, keep_masks)
    except NoTracker as exc:
        result.outcome, result.reason = Outcome.UNSUPPORTED, str(exc)
    except NotReproducible as exc:
        result.outcome, result.reason = Outcome.SKIPPED, str(exc)
    except (Exception, SystemExit) as exc:  # an impl that raises is a result, not a harness crash
        result.outcome = Outcome.ERROR
        result.error = " ".join(f"{type(exc).__name__}: {exc}".split())
        if not raised_by_impl(exc):  # never blame the impl for what its code was not part of
            result.error = OUTSIDE_IMPL + result.error
        result.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:])
    if REGISTER_WARNINGS[0] > warned_before:  # torch >= 2.14: each registration warns (capture.py)
        result.observed[REGISTER_WARNINGS_FACT] = REGISTER_WARNINGS[0] - warned_before
    result.duration_s = time.perf_counter() - start
    return result


def reproduction_difference(first: RunRecord, second: RunRecord, output_names: list[str],
                            iterations: int) -> str | None:
    """How a second identical reference run differs from the first, in anything an oracle
    compares ("the first mismatch; +N more"), or None when it does not."""
    # No checkpointed sites and no drawing sites: a reference recomputes nothing, and two runs
    # that drew the same masks are the point.  Every recorded RNG output is still compared.
    # Identity is left out: it compares a run with itself (a tracker whose fork stores a new state
    # object under a name fails it in every run), not one run with another.
    differences = [d for d in check(first, second, [], iterations, output_names, drawing=[])
                   if d.oracle != "identity"]
    if not differences:
        return None
    return differences[0].message() + (f"; +{len(differences) - 1} more" if len(differences) > 1 else "")


def require_reproducible(case: Case, first: RunRecord, second: RunRecord, output_names: list[str],
                         iterations: int) -> None:
    """`NotReproducible` when a second reference run differs from the first in anything an oracle
    compares (the ops of `OpSpec.reproducible` False)."""
    difference = reproduction_difference(first, second, output_names, iterations)
    if difference:
        unreproducible = sorted(op.value for op in case.program.ops() if not ops.REGISTRY[op].reproducible)
        raise NotReproducible(
            f"the reference is not bit-reproducible here: a second identical run differs ({difference}); the "
            f"backward of {', '.join(unreproducible)} "
            "accumulates in a run-to-run order on this GPU, so no oracle can judge this case")


def _run_both(case: Case, impl: Any, name: str, iterations: int, timeline: bool, result: CaseResult,
              keep_masks: bool = False) -> None:
    """The reference run, its check, the checkpointed run and the oracles, into `result`: eagerly
    (`_run_eager`) or, for an impl that declares ``compiled``, the whole program under
    torch.compile (`compiled.run_compiled`); one door either way, one result."""
    checkpoint_with = checkpointing(impl, case, name)
    if getattr(impl, "compiled", False):
        result.reference_runs = 1  # its own: the impl compiles the reference too
        with _impl_ran():
            result.mismatches = run_compiled(case, impl, name, iterations, checkpoint_with, result.observed)
    else:
        result.mismatches = _run_eager(case, impl, name, iterations, timeline, result, checkpoint_with, keep_masks)
    result.outcome = Outcome.MISMATCH if result.mismatches else Outcome.PASS


def _reference(case: Case, iterations: int, timeline: list | None, device: torch.device, tensors: Tensors,
               make_tracker: Callable[[torch.device], Any] | None, name: str, result: CaseResult) -> Reference:
    """The reference run of `case`, checked (`check_reference`: else the error names `name`), and
    run a second time where the program has an op that may not reproduce on the GPU: a second run
    that differs makes it `unreproducible`.  Counts its runs in ``result.reference_runs``."""
    result.reference_runs = 1
    names = RunNames.of(case)
    reference = _execute(case, iterations, timeline, device, tensors, make_tracker, None)
    check_reference(reference, names.site_streams, iterations, str(device), name, drawing=names.drawing)
    if not all(ops.REGISTRY[op].reproducible for op in case.program.ops()) and device.type == "cuda":
        result.reference_runs = 2
        again = _execute(case, iterations, None, device, tensors, make_tracker, None)
        try:
            require_reproducible(case, reference, again, names.outputs, iterations)
        except NotReproducible as exc:
            return Reference(tensors=tensors, unreproducible=str(exc))
    return Reference(reference, names, tensors)


def _run_eager(case: Case, impl: Any, name: str, iterations: int, timeline: bool, result: CaseResult,
               checkpoint_with: Callable[[Any], CheckpointFn], keep_masks: bool = False) -> list[Mismatch]:
    """The mismatches of `case` run eagerly (or captured in CUDA graphs) under `impl`; its laps
    go into ``result.timings`` and, with `timeline`, its stream timelines into ``result.timelines``."""
    device = torch.device(case.device.value)
    if device.type == "cuda":
        torch.cuda.init()  # before the RNG inventory, so CUDA generators are part of it
    clock = _Clock(result.timings)
    # ambient.preserved: an impl that leaks global state (SDPA flags, default dtype) must not
    # change the cases after it; the ambient oracle reports the leak in this one.
    with ambient.preserved(), preserved_global_rng(), ops.determinism(case.program.ops()):
        make_tracker = getattr(impl, "make_tracker", None)
        timelines = result.timelines = {"reference": [], "checkpointed": []} if timeline else {}
        # A timeline is the reference's own events: only a reference run now records them.
        kind = None if timeline else tracker_kind(impl)
        key = None if kind is None else (case.id, iterations, str(device), kind)
        kept = REFERENCES.get(key)
        # The case's inputs: every run takes fresh leaf copies of them (`Tensors.fresh_leaves`).
        tensors = kept.tensors if kept is not None else Tensors.make(case, device)
        clock.lap("setup")
        result.reference_runs = 0
        if kept is None:
            kept = _reference(case, iterations, timelines.get("reference"), device, tensors, make_tracker, name,
                              result)
            REFERENCES.put(key, kept)
        if kept.unreproducible:
            raise NotReproducible(kept.unreproducible)
        reference, names = kept.record, kept.names
        clock.lap("reference")
        with _impl_ran():
            checkpointed = _execute(case, iterations, timelines.get("checkpointed"), device, tensors,
                                    make_tracker, checkpoint_with)
        clock.lap("checkpointed")
    with _impl_ran():  # reading the checkpointed run's tensors surfaces its asynchronous CUDA errors
        mismatches = check(reference, checkpointed, names.checkpointed, iterations, names.outputs,
                           drawing=names.drawing)
    clock.lap("compare")
    if keep_masks:
        result.masks = {"reference": reference.log, "checkpointed": checkpointed.log}
    return mismatches
