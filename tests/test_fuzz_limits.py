"""The fuzzer draws what the impl can run (issue 57, item 5): an impl's limits that are values of
one axis are data (`harness.impls.limits`, its ``declared_limits``) that its `supports` answers
from and the fuzzer draws within; the rest of what `supports` declines is rejected before
anything runs.  So at least 80 % of the programs a fuzz run runs are judged, for every impl, and a
program an impl declares unsupported is never run, or, where declining it is a failure (an impl
that must support every case), run, reported and not counted as judged."""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import Phase, given, seed, settings

from harness import impls
from harness.errors import UsageError
from harness.fronts import fuzz
from harness.fronts.cli import main
from harness.impls import limits
from harness.impls.bundled import BundledAdapter
from harness.model.cases import Case, Device, Interleave, Mode, Shape, parse_case_id
from harness.model.matrix import generate
from harness.results import NOT_REPEATED, SKIPPED_OUTCOMES, CaseRecord
from harness.run.execution import Target, declined
from harness.verdict import expectations

ENTRIES = expectations.load()
SEED = 5701
REMAT = ("remat", "remat-hook", "remat-readme-hook")


def _available() -> list[str]:
    """The shipped impls that load on this machine."""
    out = []
    for name in impls.BUILTIN:
        adapter = impls.load(name)
        if getattr(adapter, "unavailable", lambda: None)() is None:
            out.append(name)
    return out


AVAILABLE = _available()

# The compiled impls compile every program (seconds each on the CPU): fewer of them.
COMPILED = {name for name in AVAILABLE if getattr(impls.load(name), "compiled", False)}


def drawn(adapter, device: Device, examples: int = 40, residual: bool = True) -> list[Case]:
    """The cases `fuzz.case_strategy` draws for `adapter` on `device` (a fixed seed, nothing run):
    within its declared limits, and, with `residual`, without what its `supports` declines."""
    cases: list[Case] = []
    declines = (lambda case: declined(adapter, case)) if residual else None
    strategy = fuzz.case_strategy(device, None, limits.of(adapter), declines)

    @seed(SEED)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=fuzz.FUZZ_HEALTH_CHECKS)
    @given(strategy)
    def collect(case: Case) -> None:
        cases.append(case)

    collect()
    return cases


@functools.cache
def _matrix() -> list[Case]:
    """Every third case of the full CPU matrix, and the default CUDA matrix."""
    return [*list(generate("full", device="cpu"))[::3], *generate("default", device="cuda")]


def test_the_torch_remat_adapters_declare_their_limits_as_data():
    # what the fuzzer conditions on for them: no reentrant form, no nested regions (the bulk of
    # what they declined before: 83-91 % of the programs drawn)
    for name in REMAT:
        declared = limits.of(impls.load(name))
        assert {(one.axis, one.excluded) for one in declared} >= {
            (limits.Axis.MODE, frozenset({Mode.REENTRANT})), (limits.Axis.NESTING, frozenset({True}))}


@pytest.mark.parametrize("name", [n for n in AVAILABLE if limits.of(impls.load(n))])
def test_an_impls_supports_answers_its_declared_limits_over_the_full_matrix(name):
    """Where an impl declares a limit, its `supports` declines every case the limit excludes, with
    the limit's reason: the declaration is no second copy that could drift.  Every third case of
    the full CPU matrix and the default CUDA matrix."""
    adapter = impls.load(name)
    declared = limits.of(adapter)
    excluded = 0
    for case in _matrix():
        reason = limits.declared(declared, case)
        if reason is not None:
            excluded += 1
            assert adapter.supports(case) == reason, case.id
    assert excluded > 0  # each declared limit matters somewhere in the matrix


@functools.cache
def runs_nothing_on(name: str, device: Device) -> bool:
    """True where `name` declines every case of the default matrix on `device` (Megatron and
    DeepSpeed on the CPU, the impls that need a process group without one): there is nothing to
    draw, and the fuzzer must say so in one line instead."""
    adapter = impls.load(name)
    return all(declined(adapter, case) for case in generate("default", device=device.value))


def _refused_in_one_line(name: str, device: Device) -> None:
    with pytest.raises(UsageError, match=rf"^{re.escape(name)} (declares no|declined every) {device.value} program"):
        fuzz.fuzz(Target(name, impls.load(name)), device, ENTRIES, examples=5, seed_value=SEED, database=None)


@pytest.mark.parametrize("device", [Device.CPU, Device.CUDA])
@pytest.mark.parametrize("name", AVAILABLE)
def test_the_strategy_draws_no_program_the_impl_declines(name, device):
    """Drawing needs no GPU: on both devices, nothing the fuzzer draws for an impl is a case the
    impl's `supports` declines (where declining it is not a failure).  An impl that runs nothing
    on the device is refused in one line (found on the GPU machine, where Megatron and DeepSpeed
    are installed: drawing for them on the CPU was unsatisfiable)."""
    if runs_nothing_on(name, device):
        _refused_in_one_line(name, device)
        return
    adapter = impls.load(name)
    cases = drawn(adapter, device)
    assert len(cases) == 40
    refused = [(case.id, declined(adapter, case)) for case in cases if declined(adapter, case)]
    assert not refused, refused[:3]


@pytest.mark.parametrize("device", [Device.CPU, Device.CUDA])
@pytest.mark.parametrize("name", [name for name in REMAT if name in AVAILABLE])
def test_the_remat_adapters_limits_are_met_by_drawing_not_by_rejecting(name, device):
    # their every limit is declared: what the strategy draws within them needs no rejection
    adapter = impls.load(name)
    cases = drawn(adapter, device, residual=False)
    assert cases and all(adapter.supports(case) is None for case in cases)
    assert all(case.mode is Mode.NONREENTRANT and not limits.nested(case.program) for case in cases)


def _fuzz(target: Target, examples: int, **options):
    records = []
    found = fuzz.fuzz(target, Device.CPU, ENTRIES, examples=examples, seed_value=SEED, database=None,
                      on_record=records.append, **options)
    return found, records


@pytest.mark.parametrize("name", AVAILABLE)
def test_every_impl_judges_at_least_80_percent_of_the_programs_it_runs(name):
    """A fixed seed, a few programs, going on after failures, known ones not shrunk: the share
    is counted from what the programs' records say, not from the clock."""
    if runs_nothing_on(name, Device.CPU):  # nothing to judge: refused in one line, not a share of 0
        _refused_in_one_line(name, Device.CPU)
        return
    [target] = [Target(name, impls.load(name))]
    found, records = _fuzz(target, 3 if name in COMPILED else 8, new_only=True, keep_going=True)
    judged = [r for r in records if r.outcome.value not in SKIPPED_OUTCOMES and r.verdict_note != NOT_REPEATED]
    assert found.tried == len(records) and found.judged == len(judged)
    assert found.judged * 100 >= 80 * found.tried, f"{name}: {found.judged} of {found.tried} judged"
    assert found.judged_percent >= 80


class _DeclinesDraws(BundledAdapter):
    """bundled, declining in code (no declared limit) the cases with draws between forward and
    backward and the odd shape: nothing the strategy can leave out by itself."""

    name = "declines-draws"
    must_support_all = False

    def supports(self, case):
        if case.interleave is Interleave.DRAWS or case.shape is Shape.ODD:
            return "declined: no draws between forward and backward, no odd shape"
        return None


class _WronglyDeclines(BundledAdapter):
    """bundled (which must support every case), declining reentrant cases without declaring them a
    known limit: a failure, never a declaration."""

    name = "wrongly-declines"

    def supports(self, case):
        return "not today" if case.mode is Mode.REENTRANT else None


def test_a_program_an_impl_declines_in_code_is_never_run_and_the_declined_are_counted():
    found, records = _fuzz(Target("declines-draws", _DeclinesDraws()), 12)
    assert found.tried == len(records) == 12 and found.judged == 12
    assert all(r.outcome.value not in SKIPPED_OUTCOMES for r in records)
    cases = [parse_case_id(r.case_id) for r in records]
    assert not any(case.interleave is Interleave.DRAWS or case.shape is Shape.ODD for case in cases)
    assert found.declined and set(found.declined) == {"declined: no draws between forward and backward, no odd shape"}


def test_an_undeclared_refusal_of_an_impl_that_must_support_everything_is_run_reported_and_not_judged():
    found, records = _fuzz(Target("wrongly-declines", _WronglyDeclines()), 40)
    refused = [r for r in records if r.outcome.value == "unsupported"]
    assert refused and all(r.verdict.value == "fail" for r in refused)
    assert found.failure is not None and found.failure.record.outcome.value == "unsupported"
    assert found.judged == found.tried - len(refused) and not found.declined


def test_an_impl_that_declares_nothing_runnable_on_the_device_is_refused_before_any_program(capsys):
    from faulty_adapters import make_no_cpu

    with pytest.raises(UsageError, match="no-cpu declares no cpu program it can run here: CUDA-only"):
        _fuzz(Target("no-cpu", make_no_cpu()), 5)
    assert main(["fuzz", "--impl", "faulty_adapters:make_no_cpu", "--device", "cpu", "--examples", "5",
                 "--no-database"]) == 2
    out, err = capsys.readouterr()
    assert err == "error: faulty_adapters:make_no_cpu declares no cpu program it can run here: CUDA-only\n"
    assert out == ""  # refused before a worker started


class _DeclinesEverything(BundledAdapter):
    name = "declines-everything"
    must_support_all = False

    def supports(self, case):
        return "not a single one"


def test_an_impl_that_declines_every_program_drawn_is_one_line_not_a_run_of_unsupported_programs():
    with pytest.raises(UsageError, match=r"declines-everything declined every cpu program drawn \(most often: "
                                         r"not a single one\)"):
        _fuzz(Target("declines-everything", _DeclinesEverything()), 3)


def test_a_run_stopped_outside_a_program_counts_its_records_as_programs_and_judged():
    def record(case_id: str, outcome: str, **extra):
        return CaseRecord.from_json({"impl": "x", "case_id": case_id, "outcome": outcome, **extra})

    flat = "nonreentrant-default-eager-flat-none-cpu"
    records = [record(flat, "pass"), record(flat.replace("flat", "nested"), "unsupported"),
               record(flat.replace("flat", "wide"), "mismatch", verdict_note=NOT_REPEATED),
               record(flat.replace("flat", "deep"), "error", error="OutOfMemoryError: CUDA out of memory."),
               record(flat.replace("flat", "siblings"), "mismatch")]
    stop = KeyboardInterrupt()
    found = fuzz.FuzzResult.of_records(records, stop)
    assert (found.tried, found.judged, found.judged_percent, found.stopped) == (5, 2, 40, stop)


@pytest.mark.skipif("remat" not in AVAILABLE, reason="torch_remat does not import here")
def test_the_summary_says_how_many_programs_were_judged_and_the_judged_rate(capsys):
    status = main(["fuzz", "--impl", "remat", "--device", "cpu", "--examples", "6", "--seed", str(SEED),
                   "--new-only", "--keep-going", "--no-database", "--no-save", "--no-isolate"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.strip().splitlines()
    assert lines[-2] == "drawn:   within remat's declared limits (mode not reentrant; no region inside a region)"
    assert re.fullmatch(r"no new failure in 6 programs, 6 judged \(100 %; [0-9.]+ s, [0-9.]+ judged/s\): .+",
                        lines[-1]), lines[-1]
