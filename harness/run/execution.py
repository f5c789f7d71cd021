"""One way to run a case: the command line, the pytest plugin and the benchmark all go through here.

* `load_targets` turns ``--impl`` values into `Target`s (the name the user gave plus its adapter);
  an impl named explicitly whose package cannot load is bad input unless unsupported cells are
  allowed.
* `resolve_devices` and `check_selection` refuse what cannot run here: ``--device cuda`` with no
  CUDA device visible, a capture mode without CUDA.
* `run_case` runs one case (in this process or in an isolated worker), looks up its expectation
  under the user's name and judges it, returning the result and its record.  The record's `impl`
  is the name the user gave, so expectations, reports and the rerun line (`report.repro_command`) all
  name what `repro --impl` can load.

Nothing here imports pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from .. import impls
from ..errors import UsageError
from ..model.cases import Capture, Case, Device
from ..results import SKIPPED_OUTCOMES, CaseRecord, Outcome, Verdict
from ..verdict import expectations as expectations_mod
from ..verdict.models import RANKS_LAYOUT, Machine
from .ranks import run_ranked
from .runner import OUTSIDE_IMPL, AdapterFault, CaseResult, declared_unsupported, run
from .stops import INTERRUPTED

# Set (to anything but 0) by a GPU CI job: no CUDA device visible is then bad input (exit 2), never
# a silent run of the CPU subset (`python -m harness run` and the pytest plugin read it).
REQUIRE_CUDA_ENV = "HARNESS_REQUIRE_CUDA"

__all__ = [
    "INTERRUPTED", "REQUIRE_CUDA_ENV",
    "CaseRun", "Target", "UsageError", "adapter_version", "check_selection", "cuda_visible", "declined", "load_targets",
    "must_support", "proved_nothing", "resolve_devices", "run_case",
]




@dataclass(frozen=True)
class Target:
    """An implementation under test: the name the user gave (its identity everywhere), its
    adapter, and whether the user named it (rather than 'all' bringing it in)."""

    name: str
    adapter: Any
    explicit: bool = True


@dataclass
class CaseRun:
    """One case run for one target: the result (with timelines, for `repro`) and its judged record."""

    result: CaseResult
    record: CaseRecord


def cuda_visible() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


def resolve_devices(value: str, require_visible: bool = True) -> list[str]:
    """Turn a --device value into device type names; 'auto' picks cuda when a GPU is visible.

    Asking for cuda where no CUDA device is visible is a `UsageError` (with `require_visible`, for
    anything that runs cases), not a run of skipped cases.
    """
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    out: list[str] = []
    for name in names or ["auto"]:
        if name == "auto":
            name = "cuda" if cuda_visible() else "cpu"
        elif name not in ("cpu", "cuda"):
            raise UsageError(f"unknown device {name!r}; valid values: auto, cpu, cuda")
        elif name == "cuda" and require_visible and not cuda_visible():
            raise UsageError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
        if name not in out:
            out.append(name)
    return out


def check_selection(cases: Sequence[Case], devices: Sequence[str], captures: Iterable[Capture] = ()) -> None:
    """Refuse a selection that asks for what this machine cannot run: a case on a CUDA device with
    none visible, or a capture mode (`captures`, the values the user filtered on) without cuda
    among `devices` (capture needs CUDA; generate() would drop those cells silently)."""
    graphs = sorted({c.value for c in captures if c is not Capture.EAGER})
    if graphs and "cuda" not in devices:
        why = "no CUDA device is visible" if not cuda_visible() else "the devices asked for are " + ", ".join(devices)
        raise UsageError(f"--capture {','.join(graphs)} needs CUDA graphs, which need a CUDA device: {why}")
    if any(c.device is Device.CUDA for c in cases) and not cuda_visible():
        first = next(c for c in cases if c.device is Device.CUDA)
        raise UsageError(f"case {first.id} needs a CUDA device: none is visible (torch.cuda.is_available() is False)")


def _explicit(values: Sequence[str] | str | None) -> set[str]:
    """The impl names the user typed (not those that 'all' stands for)."""
    if not values:
        return set()
    values = [values] if isinstance(values, str) else list(values)
    return {n.strip() for v in values for n in v.split(",") if n.strip() and n.strip() != "all"}


def _unavailable(adapter: Any) -> str | None:
    check = getattr(adapter, "unavailable", None)
    if check is None:
        return None
    try:
        return check()
    except (Exception, SystemExit) as exc:
        return f"unavailable() raised {type(exc).__name__}: {exc}"


def load_targets(values: Sequence[str] | str | None, *, allow_unsupported: bool = False,
                 default: str = "bundled") -> list[Target]:
    """The targets for --impl `values` (repeatable, comma lists, 'all'); default `default`.

    An impl the user named explicitly whose code cannot be loaded here (`adapter.unavailable()`,
    e.g. its package does not import) is a `UsageError` unless `allow_unsupported`: a run must
    not pass by reporting every cell unsupported.  Impls that only 'all' brought in may be
    unavailable; their cells are reported unsupported.  A name that cannot be loaded at all is an
    `impls.ImplError`.
    """
    names = impls.parse_impl_names(values, default=default)
    explicit = _explicit(values) or {default}
    targets = [Target(name, impls.load(name), name in explicit) for name in names]
    for target in targets:
        reason = _unavailable(target.adapter) if target.name in explicit else None
        if reason and not allow_unsupported:
            raise UsageError(f"implementation {target.name!r} cannot run here: {reason} "
                             "(--allow-unsupported runs it anyway, every case unsupported)")
    return targets


def adapter_version(adapter: Any) -> str | None:
    """The adapter's version; where it names none (or reading it raises), the version of the
    installed package that registered the impl by entry point (`impls.package_of`), else None."""
    try:
        version = getattr(adapter, "version", None)
    except (Exception, SystemExit):
        version = None
    registration = impls.package_of(adapter)
    if version is None and registration is not None and registration.version:
        return registration.version
    return version


def must_support(adapter: Any, case: Case) -> bool:
    """Whether an unsupported answer for `case` is a failure: the adapter must support every case
    (`must_support_all`) and has not declared this one a known limit (`limit`)."""
    if not getattr(adapter, "must_support_all", False):
        return False
    limit = getattr(adapter, "limit", None)
    try:
        return not (callable(limit) and limit(case))
    except Exception:  # a broken limit() declares nothing
        return True


def declined(adapter: Any, case: Case, name: str | None = None) -> str | None:
    """Why `adapter` declares `case` one it cannot run (its `supports` answer), asked without
    running anything (`supports` reads the case, never a tensor), or None.  None too where that
    answer would be a failure rather than a declaration (an impl that must support every case and
    has not declared the case a known `limit`), and where `supports` raises or answers with
    anything but a string: run, such a case reports what the impl did.  The fuzzer draws no
    program this declines (`harness.fronts.fuzz`)."""
    try:
        reason = declared_unsupported(adapter, name or getattr(adapter, "name", "?"), case)
    except AdapterFault:
        return None
    if reason is None or must_support(adapter, case):
        return None
    return reason


def judged_record(result: CaseResult, target: Target, entries: Sequence[expectations_mod.Expectation]
                  ) -> CaseRecord:
    """`result` as a record, with its expectation (looked up under the target's name and version)
    and its verdict: ``verdict``, ``verdict_note``, ``expected_failure``, ``expected_issue``,
    ``expected_outcome``, ``expected_oracles``, ``expected_entry`` (the bug's name, or 'entry N')."""
    record = result.record()
    record.impl = target.name
    # a run of several ranks: its layout is what the rank models ask (the parent is no rank itself)
    machine = Machine({**({RANKS_LAYOUT: result.rank_layout} if result.ranks > 1 else {}), **result.observed})
    entry = expectations_mod.find(entries, target.name, result.case, version=record.impl_version, machine=machine,
                                  ranks=result.ranks)  # a run of several ranks: the entries for that many
    if machine.asked:  # what the models asked of this torch: an audit elsewhere replays the same answers
        record.extra["machine_facts"] = dict(machine.asked)
    judgement = expectations_mod.judge(
        result.outcome.value, [m.oracle for m in result.mismatches], result.error, entry,
        impl=target.name, reason=result.reason,
        # Asked only where it matters (judge reads it for an unsupported case alone): a limit may
        # probe the machine (bundled asks torch which attention backend it would pick).
        must_support_all=result.outcome is Outcome.UNSUPPORTED and must_support(target.adapter, result.case),
    )
    failure = entry if entry is not None and not entry.expects_pass else None  # a pass entry expects none
    record.verdict, record.verdict_note = Verdict(judgement.verdict), judgement.note
    if result.outcome is Outcome.ERROR and result.error.startswith(OUTSIDE_IMPL):
        # No entry may excuse it: it says nothing about the impl (runner.raised_by_impl).
        failure = None
        record.verdict = Verdict.FAIL
        record.verdict_note = f"not a verdict on {target.name}: the error never passed through its code; report it"
    if failure:
        record.expected_failure, record.expected_issue = failure.reason, failure.issue
        record.expected_outcome, record.expected_oracles = failure.outcome, list(failure.oracles)
    record.expected_entry = failure.label if failure else ""
    return record


def run_case(target: Target, case: Case, entries: Sequence[expectations_mod.Expectation], *,
             worker: Any = None, iterations: int | None = None, timeline: bool = False) -> CaseRun:
    """Run `case` for `target` (in `worker`, an `isolation.CaseWorker`, when given) and judge it.

    Never raises for faults of the impl: they are results (error, crash, timeout).
    """
    if worker is not None:
        result = worker.run(case, target.name, iterations or case.program.iterations)
        result.impl_version = adapter_version(target.adapter)
    else:
        result = run(case, target.adapter, iterations, timeline=timeline, name=target.name)
    result.impl = target.name
    return CaseRun(result, judged_record(result, target, entries))


def run_cases_ranked(target: Target, cases: Sequence[Case], entries: Sequence[expectations_mod.Expectation],
                     ranks: int, case_timeout: float, tp: int = 0, cp: int = 1) -> Iterator[tuple[int, CaseRun]]:
    """(position in `cases`, its judged run) for every case, each run by `target` on `ranks`
    ranks split `tp` x `cp` x DP (`ranks.run_ranked`: one launch for all of them while no rank
    fails); never raises for the impl's faults."""
    for position, result in run_ranked(target.name, cases, ranks, case_timeout, tp=tp, cp=cp):
        result.impl_version = adapter_version(target.adapter)
        yield position, CaseRun(result, judged_record(result, target, entries))


def proved_nothing(targets: Sequence[Target], records: Iterable[CaseRecord]) -> list[str]:
    """One line per impl the user named whose selected cases were all unsupported or skipped: a
    run that ran none of them proved nothing about it, so it must not pass."""
    ran: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    for record in records:
        if record.outcome in SKIPPED_OUTCOMES:
            why = reasons.setdefault(record.impl, {})
            why[record.reason] = why.get(record.reason, 0) + 1
        else:
            ran[record.impl] = ran.get(record.impl, 0) + 1
    lines = []
    for target in targets:
        if target.explicit and not ran.get(target.name) and target.name in reasons:
            top = max(reasons[target.name].items(), key=lambda item: item[1])[0]
            total = sum(reasons[target.name].values())
            lines.append(f"{target.name}: none of its {total} selected cases ran (e.g. {top})")
    return lines
