"""Who raised: an error of the impl's code is the impl's result; one that never passed through it
(a bug of the harness, or torch in the harness's own calls) is no verdict on the impl."""

from __future__ import annotations

import pytest

from harness import impls
from harness.model.cases import parse_case_id
from harness.results import Outcome, Verdict
from harness.run import runner, workload
from harness.run.execution import Target, judged_record
from harness.verdict.expectations import Expectation

CASE = "nonreentrant-tracked-eager-flat-none-cpu"


def judged(impl: str, entries=()):
    adapter = impls.load(impl)
    result = runner.run(parse_case_id(CASE), adapter, name=impl)
    return result, judged_record(result, Target(impl, adapter), list(entries))


def test_an_error_in_the_harness_own_code_is_not_blamed_on_the_impl(monkeypatch):
    # A real slip of the harness's own code: a method called with arguments it does not take (the
    # TypeError is raised in the harness's frame; a function defined here would be a foreign frame).
    monkeypatch.setattr(workload.Workload, "forward", workload.Tensors.fresh_leaves)
    entry = Expectation("bundled", (CASE,), "an entry that would excuse any error", outcomes=("error",))
    result, record = judged("bundled", [entry])
    assert result.outcome is Outcome.ERROR
    assert result.error.startswith(runner.OUTSIDE_IMPL + "TypeError: Tensors.fresh_leaves() takes 1")
    assert record.verdict is Verdict.FAIL and record.expected_failure == ""  # no entry excuses it
    assert "not a verdict on bundled" in record.verdict_note


def test_an_error_raised_in_the_impls_checkpoint_is_the_impls():
    result, _ = judged("neg-wrong-output")
    assert result.outcome is Outcome.MISMATCH  # a control: the run itself works
    adapter = impls.load("bundled")

    def raising(fn, *args, reentrant, tracker, **kwargs):
        raise RuntimeError("the impl's own failure")

    adapter.checkpoint = raising
    result = runner.run(parse_case_id(CASE), adapter, name="bundled")
    assert result.outcome is Outcome.ERROR and result.error == "RuntimeError: the impl's own failure"


@pytest.mark.parametrize("where", ["tracker", "adapter-module"])
def test_a_frame_of_the_impls_tracker_or_package_makes_it_the_impls(where, monkeypatch):
    adapter = impls.load("bundled")
    if where == "tracker":
        make = adapter.make_tracker

        def make_tracker(device):
            tracker = make(device)

            def fork(name):  # defined here, in a test file: not the harness's own code
                raise ValueError("the tracker's own failure")

            tracker.fork = fork
            return tracker

        adapter.make_tracker = make_tracker
        expected = "ValueError: the tracker's own failure"
    else:
        def supports(case):
            raise KeyError("x")

        adapter.supports = supports  # raised in supports(): an AdapterFault, a HarnessError
        expected = "AdapterFault: adapter 'bundled': supports() raised KeyError: 'x'"
    result = runner.run(parse_case_id(CASE), adapter, name="bundled")
    assert result.outcome is Outcome.ERROR and result.error == expected
