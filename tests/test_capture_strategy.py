"""Capture strategies of the bundled checkpoint, on the CPU with a fake capture context.

The real proof is the capture matrix on a GPU; here `_capturing()` is patched to True so that the
code paths chosen under capture (stash / values), their error handling and their state restoration
run where CI can see them.
"""

from __future__ import annotations

import pytest
import torch

from harness.check.compare import bitwise_diff
from harness.checkpoint import core, rng
from harness.checkpoint.core import checkpoint
from harness.checkpoint.rng import CaptureStrategyError, StateValues, ValuePolicy
from harness.checkpoint.stash import RNGStash
from harness.impls import load
from harness.model.cases import parse_case_id
from harness.run.runner import Outcome, run

P = 0.5


@pytest.fixture
def fake_capture(monkeypatch):
    monkeypatch.setattr(core, "_capturing", lambda: True)
    monkeypatch.setattr(rng, "_capturing", lambda: True)


@pytest.fixture(autouse=True)
def _restore_cpu_rng():
    with torch.random.fork_rng(devices=[]):
        yield


def region_with_perturbed_recompute(strategy: str, reentrant: bool):
    """Forward masks and recompute masks of a region whose recompute is NOT rewound.

    The policy never rewinds, so only a strategy that hands back the forward's RNG outputs can
    reproduce the forward masks.
    """
    masks: dict[str, list[torch.Tensor]] = {"forward": [], "recompute": []}
    phase = ["forward"]

    def fn(h):
        h, mask = torch.native_dropout(h, P, True)
        masks[phase[0]].append(mask.clone())
        return h * 3.0

    class NoRewind(ValuePolicy):
        def rewind(self, snapshot):
            return None

        def restore(self, token):
            pass

    policy = NoRewind()
    policy.capture_strategy = strategy
    x = torch.rand(256).requires_grad_(True)
    out = checkpoint(fn, x, reentrant=reentrant, policy=policy)
    phase[0] = "recompute"
    out.sum().backward()
    return masks


@pytest.mark.parametrize("reentrant", [True, False])
def test_stash_hands_back_forward_draws_without_any_rewind(fake_capture, reentrant):
    masks = region_with_perturbed_recompute("stash", reentrant)
    assert len(masks["recompute"]) == 1
    assert bitwise_diff(masks["recompute"][0], masks["forward"][0], oracle="", subject="", iteration=0) is None


@pytest.mark.parametrize("reentrant", [True, False])
def test_auto_picks_the_stash_under_capture(fake_capture, reentrant):
    masks = region_with_perturbed_recompute("auto", reentrant)
    assert bitwise_diff(masks["recompute"][0], masks["forward"][0], oracle="", subject="", iteration=0) is None


@pytest.mark.parametrize("reentrant", [True, False])
def test_values_strategy_redraws_and_so_exposes_the_missing_rewind(fake_capture, reentrant):
    masks = region_with_perturbed_recompute("values", reentrant)
    assert bitwise_diff(masks["recompute"][0], masks["forward"][0], oracle="", subject="", iteration=0) is not None


@pytest.mark.parametrize("reentrant", [True, False])
def test_eager_never_stashes(reentrant):
    masks = region_with_perturbed_recompute("stash", reentrant)  # not capturing: values path
    assert bitwise_diff(masks["recompute"][0], masks["forward"][0], oracle="", subject="", iteration=0) is not None


@pytest.mark.parametrize("impl", ["bundled", "neg-host-values"])
@pytest.mark.parametrize("case_id", ["reentrant-shared-eager-nested-draws-cpu",
                                     "nonreentrant-mixed-eager-siblings-draws-cpu"])
def test_whole_cases_pass_under_a_fake_capture(fake_capture, impl, case_id):
    # Eagerly on the CPU both strategies are sound; this runs the capture code paths end to end.
    result = run(parse_case_id(case_id), load(impl))
    assert result.outcome is Outcome.PASS, result.summary()


def test_unknown_capture_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown capture_strategy 'philox'; valid: auto, stash, values"):
        checkpoint(lambda h: h, torch.ones(1), capture_strategy="philox")


def test_stash_refuses_a_recompute_that_draws_more_than_its_forward(fake_capture):
    stash = RNGStash()
    with stash:
        torch.rand(4)
    with stash.replay():
        torch.rand(4)
        with pytest.raises(RuntimeError, match="drew more RNG ops than its forward"):
            torch.rand(4)


def test_stash_refuses_a_recompute_that_draws_a_different_op(fake_capture):
    stash = RNGStash()
    with stash:
        torch.rand(4)
    with stash.replay(), pytest.raises(RuntimeError, match="where its forward drew"):
        torch.randn(4)


def test_stash_replays_in_place_ops_into_their_argument(fake_capture):
    stash = RNGStash()
    buffer = torch.empty(64)
    with stash:
        buffer.bernoulli_(0.5)
    drawn = buffer.clone()
    buffer.zero_()
    with stash.replay():
        buffer.bernoulli_(0.5)
    assert torch.equal(buffer, drawn)


class FailingGenerator:
    """A generator whose set_state fails: stands in for a half-finished rewind."""

    def __init__(self):
        self.state = torch.tensor([1], dtype=torch.uint8)

    def get_state(self):
        return self.state.clone()

    def set_state(self, value):
        raise RuntimeError("set_state refused")


def test_a_rewind_that_fails_halfway_puts_back_what_it_already_changed():
    good = torch.Generator().manual_seed(7)
    before_value = good.get_state()
    snapshot = StateValues([(good, torch.Generator().manual_seed(99).get_state()),
                            (FailingGenerator(), torch.tensor([2], dtype=torch.uint8))])
    with pytest.raises(RuntimeError, match="set_state refused"):
        ValuePolicy().rewind(snapshot)
    assert torch.equal(good.get_state(), before_value)


def test_a_snapshot_refused_during_capture_names_the_missing_api(fake_capture):
    class Refusing:
        def get_state(self):
            raise RuntimeError("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture")

    class Policy(ValuePolicy):
        def generators(self, tracker):
            return [Refusing()]

    with pytest.raises(CaptureStrategyError,
                       match=r"needs Generator.get_state during CUDA graph capture \(torch >= 2.10\)"):
        Policy().snapshot(None)
