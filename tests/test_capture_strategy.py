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


@pytest.fixture
def torch_without_philox(monkeypatch):
    """The stash tests and limits describe a torch without Generator.philox_state (CI's 2.13)."""
    monkeypatch.setattr(rng, "philox_available", lambda: False)


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
def test_auto_picks_the_stash_under_capture_without_philox_state(fake_capture, torch_without_philox, reentrant):
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
    with pytest.raises(ValueError, match="unknown capture_strategy 'device'; valid: auto, stash, values, philox"):
        checkpoint(lambda h: h, torch.ones(1), capture_strategy="device")


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
        capture_strategy = "values"

        def generators(self, tracker):
            return [Refusing()]

    with pytest.raises(CaptureStrategyError,
                       match=r"'values' needs Generator.get_state during CUDA graph capture \(torch >= 2.10\)"):
        Policy().snapshot(None)


# --- the philox strategy (torch >= 2.14), with a generator that acts out a capture ---------------


class DeviceValue:
    """Stands in for a one-element CUDA tensor of a graph (the CPU build has none)."""

    is_cuda = True

    def __init__(self, value: int) -> None:
        self.value = value

    def clone(self) -> "DeviceValue":
        return DeviceValue(self.value)

    def copy_(self, other: "DeviceValue") -> "DeviceValue":
        self.value = other.value
        return self


class Graph:
    """A capture's device seed and base offset of one generator (what each replay refills)."""

    def __init__(self, seed: int, base: int) -> None:
        self.seed, self.offset = DeviceValue(seed), DeviceValue(base)


class CapturingGenerator:
    """A CUDA generator as `philox_state` shows it: during a capture its seed and offset are the
    graph's device values and `get_state` holds the intragraph offset; eagerly, CPU tensors."""

    device = torch.device("cuda", 0)

    def __init__(self) -> None:
        self.graph: Graph | None = None
        self.seed, self.intragraph = 7, 0

    def philox_state(self, increment: int):
        assert increment == 0  # a snapshot must reserve nothing
        if self.graph is None:
            return torch.tensor([self.seed]), torch.tensor([self.intragraph]), torch.tensor([0])
        return self.graph.seed, self.graph.offset, torch.tensor([self.intragraph])

    def get_state(self) -> torch.Tensor:
        return torch.tensor([self.seed, self.intragraph])

    def set_state(self, value: torch.Tensor) -> None:
        self.seed, self.intragraph = (int(v) for v in value)


@pytest.fixture
def torch_with_philox(monkeypatch):
    monkeypatch.setattr(rng, "philox_available", lambda: True)


def test_auto_is_philox_where_the_api_exists_and_the_stash_elsewhere(monkeypatch):
    monkeypatch.setattr(rng, "philox_available", lambda: True)
    assert rng.resolve_capture_strategy("auto") == "philox" and not ValuePolicy().stash_under_capture()
    monkeypatch.setattr(rng, "philox_available", lambda: False)
    assert rng.resolve_capture_strategy("auto") == "stash" and ValuePolicy().stash_under_capture()
    assert [rng.resolve_capture_strategy(s) for s in ("stash", "values", "philox")] == ["stash", "values", "philox"]


def test_the_build_is_asked_by_capability():
    assert rng.philox_available() == hasattr(torch.Generator, "philox_state")


def test_a_philox_snapshot_saves_the_graphs_device_seed_and_offset_and_the_host_values(fake_capture,
                                                                                          torch_with_philox):
    gen, cpu = CapturingGenerator(), torch.Generator().manual_seed(3)
    forward = gen.graph = Graph(seed=7, base=100)
    gen.intragraph = 12
    snap = rng.PhiloxValues.take([cpu, gen])
    assert [(g, s.value, o.value) for g, s, o in snap.device] == [(gen, 7, 100)]  # the CPU generator has none
    assert torch.equal(snap.entries[1][1], torch.tensor([7, 12])) and torch.equal(snap.entries[0][1], cpu.get_state())
    forward.offset.value = 104  # the next replay refills the graph's tensors: the snapshot is a copy
    assert snap.device[0][2].value == 100


def test_a_philox_rewind_puts_the_forwards_values_into_the_recompute_graph_and_restores_them(fake_capture,
                                                                                              torch_with_philox):
    gen = CapturingGenerator()
    gen.graph, gen.intragraph = Graph(seed=7, base=100), 12
    policy = ValuePolicy()
    policy.capture_strategy = "philox"
    snap = rng.PhiloxValues.take([gen])
    backward = gen.graph = Graph(seed=7, base=300)  # a separate backward graph: another base offset
    gen.intragraph = 4
    token = policy.rewind(snap)
    assert (backward.seed.value, backward.offset.value, gen.intragraph) == (7, 100, 12)  # the forward's draws
    policy.restore(token)
    assert (backward.seed.value, backward.offset.value, gen.intragraph) == (7, 300, 4)  # the graph's own again


def test_the_policy_takes_a_philox_snapshot_under_capture_only(fake_capture, torch_with_philox, monkeypatch):
    gen = CapturingGenerator()
    gen.graph = Graph(seed=7, base=100)
    policy = ValuePolicy()
    monkeypatch.setattr(policy, "generators", lambda tracker: [gen])
    assert type(policy.snapshot(None)) is rng.PhiloxValues
    policy.capture_strategy = "values"
    assert type(policy.snapshot(None)) is StateValues
    monkeypatch.setattr(rng, "_capturing", lambda: False)
    policy.capture_strategy = "philox"
    assert type(policy.snapshot(None)) is StateValues  # eagerly, host values are the whole state


def test_philox_without_the_api_is_one_clear_error(fake_capture, torch_without_philox):
    with pytest.raises(CaptureStrategyError, match=r"'philox' needs Generator.philox_state \(torch >= 2.14\)"):
        checkpoint(lambda h: h * 2, torch.ones(2, requires_grad=True), capture_strategy="philox")


def test_a_philox_snapshot_written_back_outside_a_capture_says_so(torch_with_philox):
    gen = CapturingGenerator()
    gen.graph = Graph(seed=7, base=100)
    snap = rng.PhiloxValues.take([gen])
    gen.graph = None
    with pytest.raises(CaptureStrategyError, match="written back outside one"):
        snap.write_back()


@pytest.mark.parametrize("reentrant", [True, False])
def test_philox_redraws_so_a_missing_rewind_shows(fake_capture, torch_with_philox, reentrant):
    # Unlike the stash, the philox strategy redraws: without its rewind the masks differ.
    masks = region_with_perturbed_recompute("philox", reentrant)
    assert bitwise_diff(masks["recompute"][0], masks["forward"][0], oracle="", subject="", iteration=0) is not None


@pytest.mark.parametrize("case_id", ["reentrant-shared-eager-nested-draws-cpu",
                                     "nonreentrant-mixed-eager-siblings-draws-cpu"])
def test_whole_cases_pass_with_philox_under_a_fake_capture(fake_capture, torch_with_philox, case_id):
    result = run(parse_case_id(case_id), load("bundled"))
    assert result.outcome is Outcome.PASS, result.summary()


def test_bundled_limits_belong_to_its_capture_strategy(monkeypatch):
    efficient = parse_case_id("reentrant-default-separate-(native_dropout+sdpa_efficient.f16)-none-cuda")
    monkeypatch.setattr(rng, "philox_available", lambda: False)
    stash_reason = load("bundled").limit(efficient)
    assert stash_reason.startswith("the stash capture strategy hands memory-efficient attention's forward outputs")
    control = load("neg-no-restore").limit(efficient)
    assert control == f"not judged for the 'values' capture strategy where the stash is unsound: {stash_reason}"
    monkeypatch.setattr(rng, "philox_available", lambda: True)
    assert load("bundled").limit(efficient) is None
    assert load("neg-no-restore").limit(efficient) == control  # the controls rewind host values on every torch
