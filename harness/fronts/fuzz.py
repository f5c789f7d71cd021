"""Fuzzing: random region programs under an impl, a failure shrunk to its smallest program.

Hypothesis draws the cases (`case_strategy`): a checkpoint mode, a stream layout, a capture mode
(eager on the CPU; all three on CUDA), the interleave, 2 to 4 iterations, and a spec program
(`harness.model.spec`): a tree of up to `MAX_SITES` sites and regions up to `MAX_DEPTH` deep, every site
with its own op, dtype and stream (or the layout's), every region with its own passing, sites
between regions, items fed from one tensor (``&``).  Every draw shrinks towards the simplest
choice (one region, one native_dropout site, float32, 64x64, positional, the default layout, eager,
no interleave, two iterations), so the failing case Hypothesis ends with is the smallest it could
find.

Only what the impl can run is drawn (issue 57, item 5): the values its declared limits
(`harness.impls.limits`: no reentrant form, no nested regions, no capture, ...) leave, and a case
its `supports` declines otherwise (`execution.declined`) is rejected before anything runs and
counted by reason (`FuzzResult.declined`).  A declined answer that is a failure (an impl that must
support every case, refusing one it has not declared a limit) is run and reported.  A program
run is *judged* unless it was unsupported or skipped or its failure was discounted
(`FuzzResult.judged`).

`fuzz` runs cases until `examples` were run or `budget` seconds passed.  A case fails when its
verdict against the expectations file is a failure; with ``new_only``, a failure the expectations
already describe (an xfail) does not count, so the search goes on for new ones.  Hypothesis's
example database (`DATABASE_DIR`, git-ignored) replays earlier failures first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hypothesis import HealthCheck, Phase, Verbosity, assume, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky, Unsatisfiable

from ..errors import UsageError
from ..impls import limits as impl_limits
from ..impls.limits import Axis, Limit, allowed, declared
from ..model import ops
from ..model.cases import (
    LAYOUT_STREAMS,
    Capture,
    Case,
    Device,
    Interleave,
    Layout,
    Mode,
    invalid_reason,
)
from ..model.programs import SDPA_OPS, Dtype, Op, Passing, Shape
from ..model.spec import parse_spec
from ..results import NOT_REPEATED, SKIPPED_OUTCOMES, CaseRecord, Outcome, Verdict, out_of_device_memory
from ..run import stops
from ..run.execution import CaseRun, Target, declined, run_case

MAX_SITES = 8  # sites per program
MAX_DEPTH = 3  # regions inside regions
MAX_ITEMS = 3  # items per region, and at the top level
DATABASE_DIR = Path(".hypothesis") / "harness-fuzz"
BATCH = 100  # examples per Hypothesis run when fuzzing for a time budget
FAILING = ("fail",)  # verdicts that are failures; without new_only an xfail is one too
# How often each shape is drawn (a list to index; the first shrinks best).  The large shape
# exists for CUDA, where 2^20 elements move the Philox offset by another amount per call; on a CPU
# (whose generator has no such offset) it costs ~1.5-3 s a case against ~30 ms, so the CPU fuzzer
# leaves it to the matrix (`--matrix full --shape large`).
SHAPE_WEIGHTS = {
    Device.CUDA: [Shape.SMALL] * 5 + [Shape.ODD] * 3 + [Shape.LARGE],
    Device.CPU: [Shape.SMALL] * 3 + [Shape.ODD] * 2,
}


def _site_choices(device: Device, shape: Shape, limits: Sequence[Limit] = ()) -> list[tuple[Op, list[Dtype]]]:
    """The ops that can run on `device` at `shape` and that `limits` leave, each with its dtypes
    (`Op` order: the first, native_dropout, is what sites shrink to)."""
    out = []
    for op in allowed(limits, Axis.OP, Op):
        dtypes = [d for d in Dtype if ops.invalid_reason(op, d, shape, device.value) is None]
        if dtypes:
            out.append((op, dtypes))
    return out


@st.composite
def _tree(draw: Any, device: Device, shape: Shape, dtype: Dtype, mode: Mode, layout: Layout,
          limits: Sequence[Limit] = ()) -> str:
    """The body of a spec: items joined by '+', at least one of them a region; only the ops and
    passings `limits` leave, and regions inside regions only where they leave nesting."""
    choices = _site_choices(device, shape, limits)
    streams = [None, *LAYOUT_STREAMS[layout]]  # None (the layout decides) first
    passings = allowed(limits, Axis.PASSING,
                       [p for p in Passing if not (p is Passing.CLOSURE and mode is Mode.REENTRANT)])
    nests = bool(allowed(limits, Axis.NESTING, [True]))
    left = [MAX_SITES]

    def site() -> tuple[str, Op]:
        left[0] -= 1
        op, dtypes = draw(st.sampled_from(choices))
        dtypes = sorted(dtypes, key=lambda d: d is not dtype)  # the input's dtype first
        site_dtype = draw(st.sampled_from(dtypes))
        stream = draw(st.sampled_from(streams))
        text = op.value + ("" if site_dtype is dtype else f".{site_dtype.value}")
        return text + (f"@{stream}" if stream else ""), op

    def region(depth: int) -> tuple[str, list[Op]]:
        passing = draw(st.sampled_from(passings))
        parts, inner_ops = [], []
        for position in range(draw(st.integers(1, MAX_ITEMS))):
            if position and left[0] <= 0:
                break
            if nests and depth < MAX_DEPTH and left[0] > 1 and draw(st.booleans()):
                text, found = region(depth + 1)
                inner_ops += found
            else:
                text, op = site()
                inner_ops.append(op)
                if draw(st.integers(0, 3)) == 3:  # a SAVE region of this site (0, what it shrinks to: none)
                    text = f"save({text})"
            parts.append(text)
        attention = {op for op in inner_ops if op in SDPA_OPS}
        if passing is Passing.SDPA_KERNEL and len(attention) != 1:
            passing = Passing.POSITIONAL  # sdpa_kernel needs attention inside, all on one backend
        prefix = "" if passing is Passing.POSITIONAL else passing.value
        return f"{prefix}({joined(parts)})", inner_ops

    def joined(parts: list[str]) -> str:
        # '&' (the next item reads the same input as the one before) or '+'; False, what a
        # boolean shrinks to, is '+'
        return "".join(("&" if n and draw(st.booleans()) else "+" if n else "") + part for n, part in enumerate(parts))

    items = []
    for position in range(draw(st.integers(1, MAX_ITEMS))):
        if position and left[0] <= 0:
            break
        # False (what a boolean shrinks to) is a region at the top level: programs shrink to one.
        items.append(site()[0] if position and draw(st.booleans()) else region(1)[0])
    return joined(items)


# Hypothesis's health checks that would stop a fuzz run for what the fuzzer is: one example runs a
# whole checkpointed program twice (too_slow: seconds on the CPU); invalid combinations are
# rejected by `assume` after drawing (filter_too_much: most draws of the mixed layout with one
# site are invalid); nested regions draw much data (data_too_large, large_base_example).  The
# others (nested @given, fixtures, executors) would point at a fault of this module: left on.
FUZZ_HEALTH_CHECKS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                      HealthCheck.large_base_example]


def _captures(device: Device, captures: Sequence[Capture] | None) -> list[Capture]:
    """`captures`, or every capture mode `device` has."""
    if captures is None:
        return list(Capture) if device is Device.CUDA else [Capture.EAGER]
    return list(captures)


def undrawable(limits: Sequence[Limit], device: Device, captures: Sequence[Capture] | None = None) -> str | None:
    """Why `case_strategy` can draw no case under `limits` on `device` (every value of an axis
    excluded: the reasons of the limits that exclude them), or None."""
    drawn = {Axis.DEVICE: [device], Axis.MODE: list(Mode), Axis.LAYOUT: list(Layout),
             Axis.CAPTURE: _captures(device, captures), Axis.OP: [op for op, _ in _site_choices(device, Shape.SMALL)]}
    for axis, values in drawn.items():
        if not allowed(limits, axis, values):
            return "; ".join(dict.fromkeys(one.reason for one in limits if one.axis is axis))
    return None


@st.composite
def case_strategy(draw: Any, device: Device, captures: Sequence[Capture] | None = None,
                  limits: Sequence[Limit] = (), declines: Callable[[Case], str | None] | None = None) -> Case:
    """A valid case on `device` with a random spec program (the module docstring says what varies);
    `captures` limits the capture modes (default: every one the device has).  Only values that
    `limits` (an impl's `declared_limits`) leave are drawn, and a case `declines` gives a reason
    for (an impl's limits that are no single axis's values: `execution.declined`) is rejected
    (``assume``); none of this runs torch.  Without limits the draws are as they always were: a
    seed draws the same programs."""
    mode = draw(st.sampled_from(allowed(limits, Axis.MODE, Mode)))
    layout = draw(st.sampled_from(allowed(limits, Axis.LAYOUT, Layout)))
    capture = draw(st.sampled_from(allowed(limits, Axis.CAPTURE, _captures(device, captures))))
    interleave = draw(st.sampled_from(list(Interleave)))
    dtype = draw(st.sampled_from(list(Dtype)))
    shape = SHAPE_WEIGHTS[device]
    shape = shape[draw(st.integers(0, len(shape) - 1))]
    iterations = draw(st.integers(2, 4))
    header = ".".join(part for part, default in ((dtype.value, "f32"), (shape.value, "small"),
                                                  (f"x{iterations}", "x2")) if part != default)
    body = draw(_tree(device, shape, dtype, mode, layout, limits))
    program = parse_spec(f"{header}:{body}" if header else body)
    case = Case(mode, layout, capture, program, interleave, device)
    assume(invalid_reason(case) is None)  # e.g. the mixed layout with one site: not both streams
    # what the draws above cannot rule out alone (the sdpa_kernel fallback to positional passing)
    assume(declared(limits, case) is None)
    assume(declines is None or declines(case) is None)
    return case


class Found(Exception):
    """A failing case (what Hypothesis shrinks)."""

    def __init__(self, run: CaseRun) -> None:
        super().__init__(f"{run.record.outcome.value} {run.record.case_id}")
        self.run = run


@dataclass
class Finding:
    """One failure: the smallest failing case run, when it was first seen (cases run, seconds)
    and the cases run while shrinking it."""

    run: CaseRun
    found_after: int
    found_seconds: float
    shrink_steps: int
    shrink_seconds: float
    flaky: bool = False  # the smallest case failed, then passed when Hypothesis ran it again
    shrunk: bool = True  # False: the run was stopped while shrinking; `run` is the smallest seen so far


@dataclass
class FuzzResult:
    """What a fuzz run did: cases run (`tried`, shrinking included), by verdict, the seconds it
    took, and the failures found, each shrunk (one unless the run kept going)."""

    tried: int = 0
    generated: int = 0  # of `tried`, those Hypothesis generated (not shrinking steps)
    seconds: float = 0.0
    verdicts: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    shrink_steps: int = 0  # cases run while shrinking the failure now being shrunk
    repeats: int = 0  # failures like one already found (same signature), not shrunk again
    # the repeats of each kind (signature) by what differs in them (`differs`): how a known new
    # failure shows in other shapes, without shrinking each
    repeat_shapes: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)
    noisy: int = 0  # failures that a second run did not repeat bit for bit (`_repeats`)
    out_of_memory: int = 0  # failures that were the device running out of memory (no verdict)
    known: dict[str, int] = field(default_factory=dict)  # known failures (xfail) by the entry that explains them
    stale: list[str] = field(default_factory=list)  # 'case id (entry)' of cases an entry claims that passed
    stopped: BaseException | None = None  # the Ctrl-C or SIGTERM that ended the run early
    # of `tried`, those judged: run, neither unsupported nor skipped, and no failure discounted
    # (noisy, out of memory)
    judged: int = 0
    # programs drawn that the impl declines (`execution.declined`), never run: by its reason
    declined: dict[str, int] = field(default_factory=dict)
    limits: tuple[Limit, ...] = ()  # the impl's declared limits the draws kept to

    @classmethod
    def of_records(cls, records: Sequence[CaseRecord], stopped: BaseException | None = None) -> "FuzzResult":
        """What a stopped run leaves where its result was lost (stopped outside a program): its
        records, one per case, as programs run and judged (neither unsupported nor skipped, not
        noise, not the device out of memory), with the stop."""
        judged = sum(1 for r in records if r.outcome.value not in SKIPPED_OUTCOMES and r.verdict_note != NOT_REPEATED
                     and not out_of_device_memory(r.error or ""))
        return cls(tried=len(records), judged=judged, stopped=stopped)

    @property
    def judged_percent(self) -> int:
        """The share of the programs run that were judged, in percent, rounded down (100 only when
        every one was; 0 when none ran)."""
        return 100 * self.judged // self.tried if self.tried else 0

    def known_kinds(self) -> str:
        """'torch-ignores-tracker x40, torch-reentrant-container x12': the known failures by entry,
        most first ('' when none)."""
        return ", ".join(f"{label} x{n}" for label, n in sorted(self.known.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def failure(self) -> CaseRun | None:
        return self.findings[0].run if self.findings else None

    @property
    def found_after(self) -> int:
        return self.findings[0].found_after if self.findings else 0


def signature(record: CaseRecord) -> tuple[str, ...]:
    """What tells two failures apart when the run keeps going: the outcome and its failing
    oracles, or the outcome and the error's type."""
    if record.outcome is Outcome.MISMATCH:
        return ("mismatch", *sorted({m.oracle for m in record.mismatches}))
    return (record.outcome.value, record.error.split(":", 1)[0])


# Oracles whose mismatch names a site (its subject: "s1", "s1 (recompute 2 of 2)") and those
# that name a stream ("cpu", "cuda:0", "tracker:model-parallel-rng"); the others (gradient,
# output, buffer, ambient) follow from them and are named alone.
SITE_ORACLES = ("forward-mask", "recompute-mask", "fresh-randomness")
STREAM_ORACLES = ("live-stream", "identity")


def differs(record: CaseRecord, case: Case) -> str:
    """What differs in a failure, shape-independently: per failing oracle, the drawing sites as
    op@stream (the stream a site draws from: its own or the layout's) or the streams that end
    elsewhere, e.g. 'recompute-mask: rand@t; gradient; live-stream: tracker:model-parallel-rng';
    for an error, its type.  Two repeats of one kind that differ here took another shape."""
    if record.outcome is not Outcome.MISMATCH:
        return f"{record.outcome.value}: {record.error.split(':', 1)[0] or record.reason[:60]}"
    sites = {site.name: site for site in case.program.sites()}
    streams = case.streams()
    by_oracle: dict[str, set[str]] = {}
    for mismatch in record.mismatches:
        where = by_oracle.setdefault(mismatch.oracle, set())
        name = mismatch.subject.split(" ", 1)[0]
        if mismatch.oracle in SITE_ORACLES and name in sites:
            where.add(f"{sites[name].op.value}@{streams[name]}")
        elif mismatch.oracle in STREAM_ORACLES:
            where.add(mismatch.subject)
    return "; ".join(f"{oracle}: {', '.join(sorted(where))}" if where else oracle
                     for oracle, where in sorted(by_oracle.items()))


def repeat_lines(found: "FuzzResult", record: CaseRecord, most: int = 5) -> list[str]:
    """The repeats of `record`'s kind, grouped by what differs, most first: 'N x what'."""
    shapes = found.repeat_shapes.get(signature(record), {})
    ranked = sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"{n} x {what}" for what, n in ranked[:most]]
    if len(ranked) > most:
        lines.append(f"... {len(ranked) - most} more shapes ({sum(n for _, n in ranked[most:])} repeats)")
    return lines


def _count_repeat(result: "FuzzResult", run: CaseRun) -> None:
    shapes = result.repeat_shapes.setdefault(signature(run.record), {})
    what = differs(run.record, run.result.case)
    shapes[what] = shapes.get(what, 0) + 1
    result.repeats += 1


def outcome_text(record: CaseRecord) -> str:
    """'mismatch: oracle, oracle' or 'error: Type: message' (one line), as the corpus keeps it."""
    if record.outcome is Outcome.MISMATCH:
        oracles = dict.fromkeys(m.oracle for m in record.mismatches)
        return f"mismatch: {', '.join(oracles)}"
    first = (record.error or record.reason).strip().splitlines()
    return f"{record.outcome.value}: {first[0][:200]}" if first else record.outcome.value


def _repeats(done: CaseRun, again: Callable[[], CaseRun]) -> bool:
    """Whether a failure is deterministic.  Only cases with an op whose CUDA backward is not
    bit-reproducible (`OpSpec.reproducible`) are run again: their reference ran twice and agreed,
    but the checkpointed run can still differ by the backward's own run-to-run order.  A wrong
    RNG stream repeats the same bits; such noise does not."""
    case = done.result.case
    if case.device is not Device.CUDA or all(ops.REGISTRY[op].reproducible for op in case.program.ops()):
        return True
    second = again()
    return (second.record.outcome == done.record.outcome
            and [m.message() for m in second.result.mismatches] == [m.message() for m in done.result.mismatches])


def _found_in(error: BaseException) -> Found | None:
    """The last `Found` inside an exception group (Hypothesis's FlakyFailure), or None."""
    for inner in reversed(getattr(error, "exceptions", ())):
        found = inner if isinstance(inner, Found) else _found_in(inner)
        if found is not None:
            return found
    return None


def _tally(result: "FuzzResult", done: CaseRun, shrinking: bool) -> str:
    """Count one program run into `result` (tried; generated or a shrinking step; by verdict;
    known failures by entry; stale claims); its verdict."""
    verdict = Verdict(done.record.verdict).value
    result.tried += 1
    if shrinking:
        result.shrink_steps += 1
    else:
        result.generated += 1
    result.verdicts[verdict] = result.verdicts.get(verdict, 0) + 1
    if verdict == "xfail":
        label = done.record.expected_entry or "?"
        result.known[label] = result.known.get(label, 0) + 1
    elif verdict == "stale":  # an entry claims more than the bug: worth narrowing
        result.stale.append(f"{done.result.case.id} ({done.record.expected_entry or '?'})")
    return verdict


def _discounted(result: "FuzzResult", done: CaseRun, again: Callable[[], CaseRun]) -> bool:
    """Whether a failure says nothing about the checkpoint, counted apart in `result`: the device
    ran out of memory, or a second run (`again`) did not repeat it bit for bit (`_repeats`; its
    record's note says so)."""
    if out_of_device_memory(done.record.error or ""):
        result.out_of_memory += 1
        return True
    if not _repeats(done, again):
        result.noisy += 1
        done.record.verdict_note = NOT_REPEATED
        return True
    return False


def fuzz(target: Target, device: Device, entries: Sequence[Any], *, examples: int | None = None,
         budget: float | None = None, seed_value: int = 0, new_only: bool = False,
         keep_going: bool = False, captures: Sequence[Capture] | None = None,
         database: "Path | None" = DATABASE_DIR, worker: Any = None,
         progress: Callable[[FuzzResult], None] | None = None,
         on_record: Callable[[dict[str, Any]], None] | None = None,
         halt: threading.Event | None = None, seen: set[tuple[str, ...]] | None = None) -> FuzzResult:
    """Run random cases of `target` on `device` until `examples` cases were generated or `budget`
    seconds passed (one of them), and shrink the first failure to the smallest failing case.
    Only cases the impl can run are drawn (module docstring); an impl whose declared limits leave
    nothing to draw on `device`, or that declines every program drawn, is a `UsageError`.

    With `keep_going` the run goes on after a failure until the examples or the budget are spent,
    and shrinks each failure with a new `signature` (a failure like one found counts as a
    repeat).  Deterministic for a `seed_value` without a `database` (None: no example database).
    Never raises for faults of the impl (they are results, and fail the case).  With `worker` (an
    `isolation.CaseWorker`) every case runs in a worker process: a case that crashes it or leaves
    a sticky CUDA error is a `crash` result, and the next case gets a fresh process (in-process,
    such a case would make every later case fail, and shrinking would shrink the poisoned state).
    A smallest case that passes when run again is reported as flaky.

    `on_record` gets every judged case's record the moment it is judged (to put it on disk).  A
    Ctrl-C or SIGTERM (inside `stops.stoppable`) ends the run: the result so far is returned with
    `stopped` set, a failure being shrunk kept as the smallest failing case seen (`shrunk` False);
    a case the signal interrupted is not counted, whatever it returned.

    `halt` and `seen` are for searches running beside this one (`fuzz_parallel`): once `halt` is
    set no new program runs (a failure being shrunk is finished), and `seen` holds the signatures
    of the failures every search has found (a failure like one of them is a repeat).
    """
    if (examples is None) == (budget is None):
        raise ValueError("fuzz() takes examples or budget, not both or neither")
    failing = FAILING if new_only else (*FAILING, "xfail")
    limits = impl_limits.of(target.adapter)
    nothing = undrawable(limits, device, captures)
    if nothing:
        raise UsageError(f"{target.name} declares no {device.value} program it can run here: {nothing}")
    result = FuzzResult(limits=limits)
    start = time.perf_counter()

    def declines(case: Case) -> str | None:
        reason = declined(target.adapter, case, target.name)
        if reason:
            result.declined[reason] = result.declined.get(reason, 0) + 1
        return reason

    state: dict[str, Any] = {"failed": False, "seen": set() if seen is None else seen, "since": 0.0}

    def over_budget() -> bool:
        return (budget is not None and time.perf_counter() - start >= budget) or (halt is not None and halt.is_set())

    def check(case: Case) -> None:
        if over_budget() and not state["failed"]:
            return  # the budget is spent: the rest of this batch passes without running
        stops.raise_if_stopped()  # Hypothesis or the case may have caught the KeyboardInterrupt
        done = run_case(target, case, entries, worker=worker)
        stops.raise_if_stopped()  # its result may be the interruption's doing (a killed worker)
        verdict = _tally(result, done, shrinking=state["failed"])
        # the machine's doing, or run-to-run noise of a nondeterministic backward: no checkpoint's
        # (judged before the record is kept, which says so for the audit)
        not_judged = verdict in failing and _discounted(result, done, lambda: run_case(target, case, entries,
                                                                                       worker=worker))
        if not not_judged and done.record.outcome.value not in SKIPPED_OUTCOMES:
            result.judged += 1
        if on_record is not None:  # after the counts: a record whose write fails (a full disk) is counted too
            on_record(done.record)
        if progress is not None:
            progress(result)
        if verdict not in failing or not_judged:
            return
        if signature(done.record) in state["seen"]:
            _count_repeat(result, done)
            return  # like a failure this run already found and shrank
        if not state["failed"]:
            state.update(failed=True, after=result.tried, since=time.perf_counter())
        state["smallest"] = done  # Hypothesis tries smaller cases only: the latest is the smallest yet
        raise Found(done)

    db = DirectoryBasedExampleDatabase(str(database / f"{target.name}-{device.value}")) if database else None
    batch = 0
    while True:
        n = examples - result.generated if examples is not None else BATCH
        options = settings(
            max_examples=n, deadline=None, database=db, derandomize=False, report_multiple_bugs=False,
            suppress_health_check=FUZZ_HEALTH_CHECKS, verbosity=Verbosity.quiet, print_blob=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        )
        test = seed(seed_value + batch)(options(given(case_strategy(device, captures, limits, declines))(check)))
        try:
            test()
            stops.raise_if_stopped()
        except Unsatisfiable:  # not one program drawn in this batch was one the impl can run
            most = max(result.declined, key=result.declined.__getitem__, default="no program was valid")
            raise UsageError(f"{target.name} declined every {device.value} program drawn (most often: {most})"
                             ) from None
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what was found
            result.stopped = stops.stopped() or stop
            if state["failed"]:
                now = time.perf_counter()
                result.findings.append(Finding(state["smallest"], state["after"], state["since"] - start,
                                               result.shrink_steps, now - state["since"], shrunk=False))
            break
        except (Found, Flaky) as exc:  # the last failing run: Hypothesis replays the smallest last
            found = exc if isinstance(exc, Found) else _found_in(exc)
            if found is None:
                raise
            now = time.perf_counter()
            result.findings.append(Finding(found.run, state["after"], state["since"] - start,
                                           result.shrink_steps, now - state["since"], flaky=found is not exc))
            state["seen"].add(signature(found.run.record))
            state["failed"], result.shrink_steps = False, 0
            if not keep_going:
                if halt is not None:
                    halt.set()
                break
        batch += 1
        if (examples is not None and result.generated >= examples) or over_budget():
            break
    result.seconds = time.perf_counter() - start
    return result


SEED_STRIDE = 1_000_003  # search i of a parallel run starts from seed + i * SEED_STRIDE


def merged(results: Sequence[FuzzResult], seconds: float) -> FuzzResult:
    """One result for searches that ran side by side: counts added, findings in the order they
    were found (one per kind: a kind two searches both found is a repeat), the first stop."""
    total = FuzzResult(seconds=seconds)
    kinds: set[tuple[str, ...]] = set()
    for result in results:
        total.tried += result.tried
        total.judged += result.judged
        for reason, n in result.declined.items():
            total.declined[reason] = total.declined.get(reason, 0) + n
        total.limits = total.limits or result.limits
        total.generated += result.generated
        total.shrink_steps += result.shrink_steps
        total.repeats += result.repeats
        total.noisy += result.noisy
        total.out_of_memory += result.out_of_memory
        total.stale += result.stale
        for verdict, n in result.verdicts.items():
            total.verdicts[verdict] = total.verdicts.get(verdict, 0) + n
        for label, n in result.known.items():
            total.known[label] = total.known.get(label, 0) + n
        for kind, shapes in result.repeat_shapes.items():
            merged_shapes = total.repeat_shapes.setdefault(kind, {})
            for what, n in shapes.items():
                merged_shapes[what] = merged_shapes.get(what, 0) + n
        total.stopped = total.stopped or result.stopped
    for finding in sorted((f for r in results for f in r.findings), key=lambda f: f.found_seconds):
        kind = signature(finding.run.record)
        if kind in kinds:
            _count_repeat(total, finding.run)
            continue
        kinds.add(kind)
        total.findings.append(finding)
    return total


def fuzz_parallel(target: Target, device: Device, entries: Sequence[Any], workers: Sequence[Any], *,
                  examples: int | None = None, budget: float | None = None, seed_value: int = 0,
                  database: "Path | None" = DATABASE_DIR, progress: Callable[[FuzzResult], None] | None = None,
                  on_record: Callable[[CaseRecord], None] | None = None, **options: Any) -> FuzzResult:
    """`len(workers)` searches at once, one thread and one isolated case worker each (Hypothesis
    runs tests in several threads from 6.136 on), search i seeded `seed_value + i * SEED_STRIDE`;
    `examples` are shared out among them, `budget` is each one's.  Without ``keep_going`` the
    first failure stops the other searches (one being shrunk is finished); a failure of a kind
    another search found is a repeat.  Only the first search replays the example database (the
    others would replay the same failures).  `progress` and `on_record` are called under a lock,
    `progress` with the searches' combined counts.  Not deterministic for a seed beyond one
    search: which search runs a program first depends on timing.  `options`: as `fuzz`."""
    count = len(workers)
    if any(worker is None for worker in workers):  # two cases in one process share its generators
        raise ValueError("searches side by side need an isolated worker each")
    if examples is not None and examples < count:
        raise ValueError(f"{examples} programs cannot be shared among {count} searches")
    halt, seen, lock = threading.Event(), set(), threading.Lock()
    results: list[FuzzResult | None] = [None] * count
    live: list[FuzzResult] = [FuzzResult() for _ in range(count)]
    errors: list[BaseException] = []  # what a search raised, raised again here
    start = time.perf_counter()

    def report(index: int, result: FuzzResult) -> None:
        with lock:
            live[index] = result
            if progress is not None:
                progress(merged(live, time.perf_counter() - start))

    def keep(record: CaseRecord) -> None:
        with lock:
            if on_record is not None:
                on_record(record)

    def search(index: int) -> None:
        share = None if examples is None else examples // count + (index < examples % count)
        try:
            results[index] = fuzz(target, device, entries, examples=share, budget=budget,
                                  seed_value=seed_value + index * SEED_STRIDE,
                                  database=database if index == 0 else None, worker=workers[index],
                                  progress=lambda result: report(index, result), on_record=keep,
                                  halt=halt, seen=seen, **options)
        except BaseException as exc:  # noqa: BLE001 (raised again in the calling thread)
            results[index] = FuzzResult(stopped=exc if isinstance(exc, KeyboardInterrupt) else None)
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(i,), name=f"fuzz-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    stopped: KeyboardInterrupt | None = None
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)  # a timeout, so Ctrl-C is seen while waiting
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what the searches found
        stopped = stop
        halt.set()
        for worker in workers:  # a search waiting on its case returns once the process is gone
            if worker is not None:
                worker.close()
        for thread in threads:
            thread.join(30)
    failures = [e for e in errors if not isinstance(e, KeyboardInterrupt)]
    if failures and stopped is None:
        raise failures[0]
    total = merged([r for r in results if r is not None], time.perf_counter() - start)
    total.stopped = total.stopped or stopped
    return total
