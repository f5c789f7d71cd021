"""Selective activation checkpointing (`harness.impls.selective`), on the CPU.

`torch-sac-recompute` recomputes everything through SAC's dispatch modes and must judge like
``torch``'s non-reentrant checkpoint; `torch-sac-save-rng` keeps the RNG ops' outputs, so its
recompute draws nothing and even the tracked layouts (where torch never saves the tracker stream)
pass; an RNG output mutated in place afterwards is refused by SAC (a known error).
"""

from __future__ import annotations

import pytest

from harness import impls
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.run.runner import Outcome


def run(impl: str, case_id: str) -> runner.CaseResult:
    return runner.run(parse_case_id(case_id), impls.load(impl))


SAC_IMPLS = ["torch-sac-recompute", "torch-sac-save-rng", "torch-sac-titan", "torch-sac-save-first-rng"]


@pytest.mark.parametrize("impl", SAC_IMPLS)
def test_reentrant_is_declared_unsupported(impl):
    result = run(impl, "reentrant-default-eager-flat-none-cpu")
    assert result.outcome is Outcome.UNSUPPORTED
    assert "use_reentrant=False only" in result.reason


@pytest.mark.parametrize("impl", ["torch-sac-recompute", "torch-sac-save-rng", "torch-sac-titan"])
def test_policies_that_redraw_nothing_out_of_order_pass_the_default_layout(impl):
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


def test_a_saved_first_rng_op_shifts_the_next_one_in_the_recompute():
    # the first RNG op of the region is cached, so the recompute's stream starts where the forward's
    # did and rand_like's numbers reappear in bernoulli_: wrong masks, wrong gradients, streams right
    result = run("torch-sac-save-first-rng", "nonreentrant-default-eager-(rand_like+bernoulli_)-none-cpu")
    assert result.outcome is Outcome.MISMATCH
    assert {m.oracle for m in result.mismatches} == {"recompute-mask", "gradient"}
    assert {m.subject for m in result.mismatches if m.oracle == "recompute-mask"} == {"s1"}
    # one drawing site per region: nothing after the saved one, nothing shifted
    assert run("torch-sac-save-first-rng",
               "nonreentrant-default-eager-nodraw.f32.small.positional.flat-none-cpu").outcome is Outcome.PASS


def test_titans_policy_is_torch_on_the_cpu():
    # the CPU math attention decomposes below the dispatch mode: no saved op draws, so titan's save
    # list changes nothing RNG sees (the fused attention ops it saves are CUDA's)
    case = "nonreentrant-default-eager-(sdpa_math+dropout)-none-cpu"
    assert run("torch-sac-titan", case).outcome is run("torch", case).outcome is Outcome.PASS
    titan = run("torch-sac-titan", "nonreentrant-tracked-eager-flat-none-cpu")
    assert titan.outcome is Outcome.MISMATCH and "live-stream" in {m.oracle for m in titan.mismatches}


def test_policies_with_counts_get_a_fresh_policy_per_checkpoint_call():
    from harness.impls.selective import save_first_rng_policy, titan_policy

    assert save_first_rng_policy() is not save_first_rng_policy()
    first, second = impls.load("torch-sac-titan").options()["context_fn"], None
    second = impls.load("torch-sac-titan").options()["context_fn"]
    assert first() is not second()  # each call builds new contexts around a new policy
    assert titan_policy() is not titan_policy()
