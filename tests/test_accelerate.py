"""accelerate's FSDP2 activation checkpointing (issue 39): the adapters call accelerate's own
``fsdp2_apply_ac``, and what it does with randomness is claimed by one expectation entry."""

from __future__ import annotations

import pytest
import torch

from harness import impls
from harness.impls import accelerate as acc
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.verdict import expectations

pytest.importorskip("accelerate.utils.fsdp_utils")


@pytest.mark.parametrize("impl, wrapper", [("accelerate-fsdp2", "CheckpointWrapper"),
                                           ("accelerate-fsdp2-offload", "OffloadWrapper")])
def test_the_region_runs_inside_what_fsdp2_apply_ac_wraps_it_in(impl, wrapper, monkeypatch):
    adapter = impls.load(impl)
    seen = []
    real = acc._fsdp_utils().fsdp2_apply_ac

    def spy(accelerator, model):
        out = real(accelerator, model)
        seen.append(type(model.layer).__name__)
        return out

    monkeypatch.setattr(acc._fsdp_utils(), "fsdp2_apply_ac", spy)
    x = torch.ones(4, requires_grad=True)
    out = adapter.checkpoint(lambda h: h * 2, x, reentrant=False, tracker=None)
    out.sum().backward()
    assert seen == [wrapper] and torch.equal(x.grad, torch.full((4,), 2.0))


@pytest.mark.parametrize("impl", ["accelerate-fsdp2", "accelerate-fsdp2-offload"])
@pytest.mark.parametrize("case_id, outcome", [
    # a region that draws: the recompute redraws every mask from the live generator
    ("nonreentrant-default-eager-flat-none-cpu", "mismatch"),
    # nothing drawn: nothing to lose
    ("nonreentrant-default-eager-(dropout_p0)-draws-cpu", "pass"),
    ("reentrant-default-eager-flat-none-cpu", "unsupported"),
])
def test_the_adapters_on_the_cpu(impl, case_id, outcome):
    case = parse_case_id(case_id)
    result = runner.run(case, impls.load(impl))
    fired = [m.oracle for m in result.mismatches]
    assert result.outcome.value == outcome, (result.error, fired)
    entry = expectations.find(expectations.load(), impl, case)
    if outcome == "mismatch":
        assert set(fired) == {"forward-mask", "recompute-mask", "gradient", "live-stream", "output"}
        assert entry is not None and entry.name == "accelerate-fsdp2-drops-rng"
        assert entry.explains(result.outcome.value, fired, result.error), entry
    elif outcome == "pass":
        assert entry is None


def test_without_fsdp2_apply_ac_every_case_is_unsupported_with_the_reason(monkeypatch):
    def missing():
        raise ImportError("No module named 'accelerate'")

    monkeypatch.setattr(acc, "_fsdp_utils", missing)
    reason = acc.AccelerateFSDP2Adapter().supports(parse_case_id("nonreentrant-default-eager-flat-none-cpu"))
    assert reason.startswith("accelerate does not import") and "No module named 'accelerate'" in reason
