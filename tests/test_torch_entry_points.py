"""torch's checkpoint reached the other ways users reach it (harness/impls/torch_checkpoint.py):
``checkpoint_wrapper`` (both CheckpointImpls), transformers' ``functools.partial`` binding, and the
decorator form where this torch has it."""

from __future__ import annotations

import pytest

from harness import impls
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.run.runner import Outcome

KEYWORD_REENTRANT = "reentrant-untracked-eager-native_dropout.f32.small.keyword.flat-none-cpu"


def run(impl: str, case_id: str) -> runner.CaseResult:
    return runner.run(parse_case_id(case_id), impls.load(impl))


@pytest.mark.parametrize("impl", ["torch-checkpoint-wrapper", "torch-partial"])
@pytest.mark.parametrize("case_id", ["reentrant-default-eager-nested-draws-cpu",
                                     "nonreentrant-default-eager-nested-draws-cpu"])
def test_the_other_doors_pass_what_torch_passes(impl, case_id):
    assert run(impl, case_id).outcome is Outcome.PASS


def test_the_wrapper_packs_keywords_for_its_reentrant_mode():
    # plain torch raises for a keyword input to a reentrant checkpoint; checkpoint_wrapper packs
    # keywords into positional arguments, so the region runs and is exact
    assert run("torch", KEYWORD_REENTRANT).outcome is Outcome.ERROR
    assert run("torch-checkpoint-wrapper", KEYWORD_REENTRANT).outcome is Outcome.PASS


def test_a_keyword_bound_into_a_partial_has_no_gradient_path_in_reentrant_mode():
    result = run("torch-partial", KEYWORD_REENTRANT)
    assert result.outcome is Outcome.ERROR
    assert "does not require grad" in result.error


@pytest.mark.parametrize("impl", ["torch-checkpoint-wrapper", "torch-partial"])
def test_the_other_doors_ignore_the_tracker_like_torch(impl):
    result = run(impl, "nonreentrant-tracked-eager-flat-none-cpu")
    assert result.outcome is Outcome.MISMATCH
    assert {"recompute-mask", "live-stream"} <= {m.oracle for m in result.mismatches}


def test_the_decorator_form_is_detected_by_capability():
    import torch.utils.checkpoint

    adapter = impls.load("torch-decorator")
    try:
        torch.utils.checkpoint.checkpoint(use_reentrant=False)
        has_it = True
    except TypeError:
        has_it = False
    if has_it:
        assert adapter.unavailable() is None
        assert run("torch-decorator", "nonreentrant-default-eager-nested-draws-cpu").outcome is Outcome.PASS
    else:
        assert adapter.unavailable().startswith("this torch's checkpoint has no decorator form")
        assert adapter.supports(parse_case_id("nonreentrant-default-eager-flat-none-cpu")) == adapter.unavailable()
