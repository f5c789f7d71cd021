"""Selective activation checkpointing (`harness.impls.selective`), on the CPU.

`torch-sac-recompute` recomputes everything through SAC's dispatch modes and must judge like
``torch``'s non-reentrant checkpoint; `torch-sac-save-rng` keeps the RNG ops' outputs, so its
recompute draws nothing and even the tracked layouts (where torch never saves the tracker stream)
pass; an RNG output mutated in place afterwards is refused by SAC (a known error).
"""

from __future__ import annotations

import pytest

from harness import impls, runner
from harness.cases import parse_case_id
from harness.runner import Outcome


def run(impl: str, case_id: str) -> runner.CaseResult:
    return runner.run(parse_case_id(case_id), impls.load(impl))


@pytest.mark.parametrize("impl", ["torch-sac-recompute", "torch-sac-save-rng"])
def test_reentrant_is_declared_unsupported(impl):
    result = run(impl, "reentrant-default-eager-flat-none-cpu")
    assert result.outcome is Outcome.UNSUPPORTED
    assert "use_reentrant=False only" in result.reason


@pytest.mark.parametrize("impl", ["torch-sac-recompute", "torch-sac-save-rng"])
def test_both_policies_pass_the_default_layout(impl):
    assert run(impl, "nonreentrant-default-eager-nested-draws-cpu").outcome is Outcome.PASS


def test_recompute_all_fails_tracked_like_torch():
    sac = run("torch-sac-recompute", "nonreentrant-tracked-eager-flat-none-cpu")
    plain = run("torch", "nonreentrant-tracked-eager-flat-none-cpu")
    assert sac.outcome is plain.outcome is Outcome.MISMATCH
    assert {m.oracle for m in sac.mismatches} == {m.oracle for m in plain.mismatches}
    assert {"recompute-mask", "live-stream"} <= {m.oracle for m in sac.mismatches}


def test_saving_rng_outputs_needs_no_tracker_rewind():
    # torch never saves the tracker stream; with the RNG outputs cached, the recompute draws
    # nothing from it, so masks, gradients and the stream's end state all match.
    assert run("torch-sac-save-rng", "nonreentrant-tracked-eager-nested-draws-cpu").outcome is Outcome.PASS


def test_an_rng_output_mutated_in_place_is_refused():
    result = run("torch-sac-save-rng", "nonreentrant-default-eager-dropout_inplace.f32.small.positional.flat-none-cpu")
    assert result.outcome is Outcome.ERROR
    assert "cached during selective activation checkpoint has been mutated" in result.error
