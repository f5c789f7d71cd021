"""Meta-tests: the harness catches each negative control, in exactly the expected cells.

Every shipped impl runs the eager CPU cases of the first matrix's programs (flat, nested,
siblings) once (cached per impl); the tests assert which cases pass and which mismatch, and which
oracle reports the failure.  `test_controls_over_programs` checks the controls whose bug shows
whatever the program over one case of each op, dtype, shape, passing and nesting.  A harness that cannot fail is
worthless, and so is one that fails the correct implementation.
"""

from __future__ import annotations

import functools
from typing import Callable

import pytest

from harness import impls
from harness.model import cases, matrix
from harness.model.cases import Case, Interleave, Layout, Nesting
from harness.run import runner
from harness.run.runner import CaseResult, Outcome
from harness.run.workload import case_streams

CPU_CASES = tuple(matrix.generate(device="cpu", program="flat,nested,siblings"))

TRACKER_LAYOUTS = (Layout.TRACKED, Layout.MIXED, Layout.SHARED)
EVERY_ORACLE_OF_A_SKIPPED_REWIND = {"forward-mask", "recompute-mask", "gradient", "live-stream", "output"}


def mismatch(*oracles: str) -> tuple[str, frozenset[str]]:
    return ("mismatch", frozenset(oracles))


def _remat_limit(case: Case) -> "tuple[str, frozenset[str]] | None":
    """Unsupported where torch_remat cannot run the case (or is not installed), else a pass."""
    if impls.load("remat").unavailable() or case.mode.value == "reentrant" or case.nesting is Nesting.NESTED:
        return ("unsupported", frozenset())
    return None


# impl -> case -> None where the case must pass, else (outcome, oracles that must all fire).
Expected = Callable[[Case], "tuple[str, frozenset[str]] | None"]
EXPECTED: dict[str, Expected] = {
    "bundled": lambda case: None,
    "torch": lambda case: mismatch(*EVERY_ORACLE_OF_A_SKIPPED_REWIND) if case.layout in TRACKER_LAYOUTS else None,
    "neg-live-handles": lambda case: mismatch(*EVERY_ORACLE_OF_A_SKIPPED_REWIND),
    "neg-no-rewind": lambda case: mismatch(*EVERY_ORACLE_OF_A_SKIPPED_REWIND),
    "neg-ignore-tracker": lambda case: (
        mismatch(*EVERY_ORACLE_OF_A_SKIPPED_REWIND) if case.layout in TRACKER_LAYOUTS else None),
    "neg-no-restore": lambda case: (
        mismatch("forward-mask", "gradient", "live-stream", "output")
        if case.interleave is Interleave.DRAWS or case.nesting is not Nesting.FLAT else None),
    # One process is rank 0 of 1, where these are `bundled` (their bugs need ranks: tests/test_ranks.py).
    "neg-rank0-snapshot": lambda case: None,
    "neg-rank-reseed": lambda case: None,
    "neg-rank-cp-blind": lambda case: None,
    # Its bug (capture-relative host values) needs separate CUDA graphs; eagerly it is `bundled`.
    "neg-host-values": lambda case: None,
    # The controls that prove the other oracles and the reference check can fail:
    "neg-no-recompute": lambda case: mismatch("recompute-mask"),
    "neg-stale-rng": lambda case: (
        mismatch("fresh-randomness", "forward-mask", "gradient", "live-stream", "output")
        if case.interleave is Interleave.NONE else mismatch("forward-mask", "gradient", "live-stream", "output")),
    "neg-extra-draw": lambda case: (
        mismatch("live-stream") if case.layout in (Layout.TRACKED, Layout.SHARED)
        else mismatch("forward-mask", "gradient", "live-stream", "output")),
    "neg-wrong-output": lambda case: mismatch("output"),
    "neg-replace-streams": lambda case: None if case.layout is Layout.UNTRACKED else mismatch("identity"),
    "neg-inert-fork": lambda case: ("error", frozenset()) if case.layout in TRACKER_LAYOUTS else None,
    "neg-copied-alias": lambda case: ("error", frozenset()) if case.layout is Layout.SHARED else None,
    # Its bug needs three regions pending at once (deep, wide: tests/test_programs.py).
    "neg-two-slots": lambda case: None,
    # Leaked ambient state (issue 29): masks, streams and gradients stay right, only the ambient
    # oracle sees the state left changed (the default dtype also moves the CPU generator in the
    # interleaved draws of the next iteration: live-stream joins in there).
    "neg-leak-sdpa": lambda case: mismatch("ambient"),
    "neg-leak-deterministic": lambda case: mismatch("ambient"),
    "neg-leak-default-dtype": lambda case: mismatch("ambient"),
    "neg-leak-autocast": lambda case: mismatch("ambient"),
    "neg-leak-stream": lambda case: None,  # a CUDA stream: on the CPU it is `bundled`
    # Their bugs need a structure the first matrix lacks (tests/test_programs.py): one tensor
    # feeding two regions, a third iteration.
    "neg-id-pool": lambda case: None,
    "neg-stale-third-step": lambda case: None,
    # torch_remat with a hook that does not realign after a SAVE body (issue 57): the first
    # matrix has no SAVE body, so each is remat-hook there (non-reentrant, not nested; torch_remat
    # has neither, and without torch_remat every cell is unsupported); tests/test_programs.py
    # shows where they are caught.
    "neg-remat-entry-only": lambda case: _remat_limit(case),
    "neg-remat-save-no-tracker": lambda case: _remat_limit(case),
}
# Where each control's failure is exactly its own oracle (nothing else fires): with that oracle
# switched off, the control would pass these cells, so they prove the oracle can fail.
ONLY_ORACLE: dict[str, tuple[str, Callable[[Case], bool]]] = {
    "neg-no-recompute": ("recompute-mask", lambda case: True),
    "neg-wrong-output": ("output", lambda case: case.nesting is Nesting.FLAT),
    "neg-replace-streams": ("identity", lambda case: case.layout is Layout.DEFAULT),
    "neg-extra-draw": ("live-stream", lambda case: case.layout in (Layout.TRACKED, Layout.SHARED)),
    "neg-leak-sdpa": ("ambient", lambda case: True),
    "neg-leak-deterministic": ("ambient", lambda case: True),
    "neg-leak-autocast": ("ambient", lambda case: True),
    "neg-leak-default-dtype": ("ambient", lambda case: case.interleave is Interleave.NONE),
}
EXPECTED_MISMATCH: dict[str, Callable[[Case], bool]] = {  # a failure (a cell it declares unsupported is none)
    name: (lambda case, expect=expect: (expect(case) or ("pass",))[0] not in ("pass", "unsupported"))
    for name, expect in EXPECTED.items()
}
# Controls whose bug cannot show on the eager CPU matrix; they must at least pass it cleanly.
CAPTURE_ONLY = ("neg-host-values", "neg-leak-stream")  # and CUDA only: a leaked CUDA stream
# Controls whose bug needs a program beyond the first matrix's (three regions pending at once);
# tests/test_programs.py shows where they are caught.
PROGRAM_ONLY = ("neg-two-slots", "neg-id-pool", "neg-stale-third-step", "neg-remat-entry-only",
                "neg-remat-save-no-tracker")
# Controls whose bug needs several ranks (`--ranks 2`; neg-rank-cp-blind `--ranks 4 --tp 2 --cp 2`):
# tests/test_ranks.py shows where they are caught.
RANKS_ONLY = ("neg-rank0-snapshot", "neg-rank-reseed", "neg-rank-cp-blind")
TRACKER_BLIND = ("torch", "neg-ignore-tracker")  # save only the device default generators
NEVER_REWOUND = ("neg-live-handles", "neg-no-rewind")  # recompute draws at a later offset


@functools.lru_cache(maxsize=None)
def results(name: str) -> dict[str, CaseResult]:
    """Case id -> result of `name` over the eager CPU matrix (computed once per impl)."""
    impl = impls.load(name)
    return {case.id: runner.run(case, impl) for case in CPU_CASES}


def failing(name: str) -> list[tuple[Case, CaseResult]]:
    """(case, result) for every case `name` mismatches, in matrix order."""
    by_id = results(name)
    return [(c, by_id[c.id]) for c in CPU_CASES if by_id[c.id].outcome is Outcome.MISMATCH]


def oracles(result: CaseResult) -> set[str]:
    return {m.oracle for m in result.mismatches}


def site_name(subject: str) -> str:
    """'s1 (recompute 2 of 3)' -> 's1'."""
    return subject.split(" ")[0]


def site_streams(case: Case) -> dict[str, str | None]:
    """Each checkpointed site's stream (None: the default generator)."""
    streams = case_streams(case)
    return {site.name: streams[site.name] for site in case.program.checkpointed_sites()}


def recompute_mismatch_sites(result: CaseResult) -> set[str]:
    return {site_name(m.subject) for m in result.mismatches if m.oracle == "recompute-mask"}


# --- the matrix ---------------------------------------------------------------------------------


def test_cpu_matrix_is_the_full_eager_matrix():
    assert len(CPU_CASES) == 60


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_case_errors_unless_expected(name):
    bad = {cid: (r.outcome.value, r.error or r.reason) for cid, r in results(name).items()
           if r.outcome not in (Outcome.PASS, Outcome.MISMATCH)
           and (EXPECTED[name](cases.parse_case_id(cid)) or ("",))[0] != r.outcome.value}
    assert bad == {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_outcome_and_oracle_matrix(name):
    """Every cell has the expected outcome and, for a mismatch, every expected oracle fires."""
    wrong = []
    for case in CPU_CASES:
        result = results(name)[case.id]
        want = EXPECTED[name](case)
        want_outcome, want_oracles = want if want else ("pass", frozenset())
        if result.outcome.value != want_outcome or not want_oracles <= oracles(result):
            wrong.append(f"{case.id}: {result.outcome.value} {sorted(oracles(result))}, expected "
                         f"{want_outcome} {sorted(want_oracles)}\n    {result.summary()[:300]}")
    assert not wrong, f"{name}: {len(wrong)} wrong cells\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", sorted(ONLY_ORACLE))
def test_controls_caught_by_one_oracle_alone(name):
    oracle, where = ONLY_ORACLE[name]
    cells = [case for case in CPU_CASES if where(case)]
    assert cells
    assert {case.id: sorted(oracles(results(name)[case.id])) for case in cells} == \
        {case.id: [oracle] for case in cells}


def test_the_forward_mask_and_fresh_randomness_oracles_fire_where_nothing_else_could_tell():
    # neg-stale-rng: in `none` cells iteration 1 redraws iteration 0's masks; neg-extra-draw: the
    # forward's masks are not the reference's.  (Alone they cannot fire: a wrong mask changes the
    # gradients and outputs too; tests/test_oracles.py shows each firing on its own.)
    stale = [c.id for c in CPU_CASES if c.interleave is Interleave.NONE
             and "fresh-randomness" in oracles(results("neg-stale-rng")[c.id])]
    assert len(stale) == len([c for c in CPU_CASES if c.interleave is Interleave.NONE])
    extra = [c.id for c in CPU_CASES if "forward-mask" in oracles(results("neg-extra-draw")[c.id])]
    assert len(extra) == len([c for c in CPU_CASES if c.layout not in (Layout.TRACKED, Layout.SHARED)])


def test_the_inert_fork_is_a_reference_error_naming_the_adapter():
    for case in CPU_CASES:
        result = results("neg-inert-fork")[case.id]
        if case.layout in TRACKER_LAYOUTS:
            assert result.error.startswith(
                "ReferenceCheckError: reference check failed for impl 'neg-inert-fork': tracker fork("), result.error
            assert "did not switch streams" in result.error


def test_every_mismatch_carries_records():
    for name in EXPECTED_MISMATCH:
        for case, result in failing(name):
            assert result.mismatches, f"{name} {case.id}"


# --- where each control is caught ---------------------------------------------------------------


@pytest.mark.parametrize("name", NEVER_REWOUND)
def test_never_rewound_controls_fail_recompute_and_gradient(name):
    missing = [
        f"{case.id}: {sorted(oracles(result))}"
        for case, result in failing(name)
        if not {"recompute-mask", "gradient"} <= oracles(result)
    ]
    assert len(failing(name)) == len(CPU_CASES)
    assert missing == []


@pytest.mark.parametrize("name", TRACKER_BLIND)
def test_tracker_blind_impls_fail_only_on_tracker_sites(name):
    problems = []
    for case, result in failing(name):
        streams = site_streams(case)
        sites = recompute_mismatch_sites(result)
        tracker_sites = {s for s in sites if streams[s] is not None}
        default_sites = {s for s in sites if streams[s] is None}
        if not tracker_sites or default_sites:
            problems.append(f"{case.id}: recompute-mask on {sorted(sites)}, streams {streams}")
    assert failing(name), f"{name} was never caught"
    assert problems == []


def test_tracker_blind_failures_include_a_default_site_where_the_layout_has_one():
    # keeps the test above honest: in mixed layouts there are default-stream sites to spare
    case = cases.parse_case_id("reentrant-mixed-eager-flat-none-cpu")
    assert None in site_streams(case).values()
    assert recompute_mismatch_sites(results("neg-ignore-tracker")[case.id]) == {"s1"}


def test_no_restore_is_never_caught_by_the_recompute_masks():
    caught = [case.id for case, result in failing("neg-no-restore")
              if "recompute-mask" in oracles(result)]
    assert caught == []


def test_no_restore_failures_have_a_live_stream_mismatch():
    assert failing("neg-no-restore")
    missing = [case.id for case, result in failing("neg-no-restore")
               if "live-stream" not in oracles(result)]
    assert missing == []


# --- coverage of the controls -------------------------------------------------------------------


def test_every_negative_control_has_expectations():
    assert set(impls.NEGATIVE_CONTROLS) <= set(EXPECTED)


def test_every_eager_negative_control_is_caught_somewhere():
    for name in impls.NEGATIVE_CONTROLS:
        if name not in CAPTURE_ONLY + PROGRAM_ONLY + RANKS_ONLY:
            caught = [r for r in results(name).values() if r.outcome is not Outcome.PASS]
            assert caught, f"{name} passes every case: the harness cannot see its bug"


def test_capture_only_controls_are_shipped_controls():
    assert set(CAPTURE_ONLY + PROGRAM_ONLY + RANKS_ONLY) <= set(impls.NEGATIVE_CONTROLS)


def test_expectations_name_only_shipped_impls():
    assert set(EXPECTED_MISMATCH) <= set(impls.BUILTIN)


def test_a_copied_alias_is_a_reference_error_naming_the_adapter():
    for case in CPU_CASES:
        result = results("neg-copied-alias")[case.id]
        if case.layout is Layout.SHARED:
            assert result.error.startswith(
                "ReferenceCheckError: reference check failed for impl 'neg-copied-alias': tracker alias "
                "'shared-b' does not share the state of 'shared-a'"), result.error


@pytest.mark.parametrize("control", RANKS_ONLY)
def test_in_one_process_a_rank_control_captures_as_bundled_does(control, monkeypatch):
    # The CUDA matrix on an H100 (torch 2.11) failed 49 separate-graph cells of each: they rewound
    # with the values strategy of the other controls (neg-host-values' bug).  One process: bundled's
    # strategy; with ranks: values, so their bug shows in graphs too.
    from harness.impls import negative

    policy = impls.load(control).policy
    assert policy.strategy() == impls.load("bundled").policy.strategy()
    monkeypatch.setattr(negative, "_group_world", lambda: 2)
    assert policy.strategy() == "values"
