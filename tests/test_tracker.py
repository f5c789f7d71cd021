"""The RNG states tracker on CPU (value mode), and the stream inventory built on it."""

from __future__ import annotations

import pytest
import torch

from harness.check.streams import compare_streams
from harness.checkpoint import RNGStatesTracker, TrackerError
from harness.run.streams import alias_groups, preserved_global_rng, snapshot_streams


@pytest.fixture(autouse=True)
def _restore_cpu_rng():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


@pytest.fixture
def tracker() -> RNGStatesTracker:
    t = RNGStatesTracker("cpu")
    t.add("mp", 7)
    return t


def cpu_state() -> torch.Tensor:
    return torch.default_generator.get_state()


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- registry -----------------------------------------------------------------------------------


def test_cpu_tracker_uses_value_mode():
    assert RNGStatesTracker("cpu").graphsafe is False


def test_graphsafe_mode_is_refused_on_cpu():
    with pytest.raises(ValueError, match="graph-safe"):
        RNGStatesTracker("cpu", graphsafe=True)


def test_add_creates_a_seeded_stream(tracker):
    assert tracker.names() == ["mp"]
    gen = tracker.generator("mp")
    assert gen.device.type == "cpu"
    assert torch.equal(gen.get_state(), seeded(7).get_state())


def test_duplicate_add_is_an_error(tracker):
    with pytest.raises(TrackerError, match="'mp' already exists"):
        tracker.add("mp", 8)


def test_duplicate_alias_name_is_an_error(tracker):
    with pytest.raises(TrackerError, match="already exists"):
        tracker.add_alias("mp", "mp")


def test_unknown_name_error_lists_known_names(tracker):
    tracker.add("other", 9)
    with pytest.raises(TrackerError) as excinfo:
        tracker.generator("nope")
    assert str(excinfo.value) == "unknown RNG stream 'nope'; known: mp, other"


def test_unknown_name_in_fork_is_an_error(tracker):
    with pytest.raises(TrackerError, match="known: mp"):
        with tracker.fork("nope"):
            pass


def test_unknown_name_in_empty_tracker_says_none():
    with pytest.raises(TrackerError, match="known: none"):
        RNGStatesTracker("cpu").generator("nope")


def test_alias_of_unknown_name_is_an_error(tracker):
    with pytest.raises(TrackerError, match="unknown RNG stream 'missing'"):
        tracker.add_alias("alias", "missing")


# --- fork ---------------------------------------------------------------------------------------


def test_fork_draws_from_the_stream(tracker):
    with tracker.fork("mp"):
        drawn = torch.rand(16)
    assert torch.equal(drawn, torch.rand(16, generator=seeded(7)))


def test_fork_leaves_the_default_generator_unchanged(tracker):
    before = cpu_state()
    with tracker.fork("mp"):
        torch.rand(16)
    assert torch.equal(cpu_state(), before)


def test_draws_outside_fork_do_not_touch_the_stream(tracker):
    before = tracker.get_states()["mp"]
    torch.rand(16)
    assert torch.equal(tracker.get_states()["mp"], before)


def test_successive_forks_continue_the_stream(tracker):
    with tracker.fork("mp"):
        first = torch.rand(8)
    torch.rand(3)  # a default-generator draw in between must not matter
    with tracker.fork("mp"):
        second = torch.rand(8)
    reference = seeded(7)
    assert torch.equal(first, torch.rand(8, generator=reference))
    assert torch.equal(second, torch.rand(8, generator=reference))


def test_fork_restores_default_generator_when_the_block_raises(tracker):
    before = cpu_state()
    with pytest.raises(RuntimeError, match="inside"):
        with tracker.fork("mp"):
            torch.rand(4)
            raise RuntimeError("inside")
    assert torch.equal(cpu_state(), before)


# --- aliases ------------------------------------------------------------------------------------


@pytest.fixture
def aliased() -> RNGStatesTracker:
    t = RNGStatesTracker("cpu")
    t.add("a", 3)
    t.add_alias("b", "a")
    return t


def test_alias_shares_one_object(aliased):
    assert aliased.generator("a") is aliased.generator("b")
    assert aliased.names() == ["a", "b"]


def test_generators_lists_an_aliased_state_once(aliased):
    aliased.add("c", 4)
    gens = aliased.generators()
    assert len(gens) == 2
    assert gens[0] is aliased.generator("a")


def test_draw_through_alias_advances_the_original(aliased):
    before = aliased.get_states()["a"]
    with aliased.fork("b"):
        first = torch.rand(8)
    states = aliased.get_states()
    assert not torch.equal(states["a"], before)
    assert torch.equal(states["a"], states["b"])
    with aliased.fork("a"):
        second = torch.rand(8)
    reference = seeded(3)
    assert torch.equal(first, torch.rand(8, generator=reference))
    assert torch.equal(second, torch.rand(8, generator=reference))


# --- states -------------------------------------------------------------------------------------


def test_get_states_returns_value_copies(tracker):
    state = tracker.get_states()["mp"]
    kept = state.clone()
    with tracker.fork("mp"):
        torch.rand(8)
    assert torch.equal(state, kept)
    assert not torch.equal(tracker.get_states()["mp"], kept)


def test_set_states_writes_in_place(tracker):
    gen = tracker.generator("mp")
    initial = tracker.get_states()
    with tracker.fork("mp"):
        first = torch.rand(8)
    tracker.set_states(initial)
    assert tracker.generator("mp") is gen
    assert torch.equal(gen.get_state(), initial["mp"])
    with tracker.fork("mp"):
        assert torch.equal(torch.rand(8), first)


def test_set_states_through_an_alias_keeps_the_alias(aliased):
    initial = aliased.get_states()["a"]
    with aliased.fork("a"):
        torch.rand(8)
    aliased.set_states({"b": initial})
    assert aliased.generator("a") is aliased.generator("b")
    assert torch.equal(aliased.get_states()["a"], initial)


def test_set_states_with_unknown_name_is_an_error(tracker):
    with pytest.raises(TrackerError, match="known: mp"):
        tracker.set_states({"nope": tracker.get_states()["mp"]})


# --- preserved_global_rng -----------------------------------------------------------------------


def test_preserved_global_rng_restores_the_cpu_generator_value():
    before = cpu_state()
    with preserved_global_rng():
        torch.rand(100)
        torch.manual_seed(99)
    assert torch.equal(cpu_state(), before)


def test_preserved_global_rng_restores_after_an_exception():
    before = cpu_state()
    with pytest.raises(RuntimeError):
        with preserved_global_rng():
            torch.rand(100)
            raise RuntimeError("boom")
    assert torch.equal(cpu_state(), before)


def test_preserved_global_rng_keeps_the_generator_object():
    gen = torch.default_generator
    with preserved_global_rng():
        torch.rand(3)
    assert torch.default_generator is gen


# --- snapshot_streams / compare_streams ---------------------------------------------------------


def test_snapshot_without_tracker_holds_only_device_defaults():
    snap = snapshot_streams(None)
    assert "cpu" in snap.states
    assert not any(name.startswith("tracker:") for name in snap.states)
    assert snap.alias_groups == ()


def test_snapshot_names_tracker_streams_and_alias_groups(aliased):
    aliased.add("c", 4)
    snap = snapshot_streams(aliased)
    assert {"cpu", "tracker:a", "tracker:b", "tracker:c"} <= set(snap.states)
    assert snap.alias_groups == (("a", "b"),)
    assert alias_groups(aliased) == (("a", "b"),)


def test_snapshot_is_a_value_copy(tracker):
    snap = snapshot_streams(tracker)
    kept = {name: state.clone() for name, state in snap.states.items()}
    torch.rand(8)
    with tracker.fork("mp"):
        torch.rand(8)
    for name, state in snap.states.items():
        assert torch.equal(state, kept[name]), name


def test_equal_trackers_compare_equal():
    a, b = RNGStatesTracker("cpu"), RNGStatesTracker("cpu")
    a.add("mp", 5)
    b.add("mp", 5)
    assert compare_streams(snapshot_streams(b), snapshot_streams(a), iteration=0) == []


def test_compare_streams_detects_a_moved_stream():
    expected, got = RNGStatesTracker("cpu"), RNGStatesTracker("cpu")
    expected.add("mp", 5)
    got.add("mp", 5)
    reference = snapshot_streams(expected)
    with got.fork("mp"):
        torch.rand(3)
    mismatches = compare_streams(snapshot_streams(got), reference, iteration=1)
    assert [(m.oracle, m.subject, m.iteration) for m in mismatches] == [
        ("live-stream", "tracker:mp", 1)
    ]
    assert mismatches[0].count >= 1


def test_compare_streams_detects_a_moved_cpu_generator(tracker):
    reference = snapshot_streams(tracker)
    torch.rand(3)
    mismatches = compare_streams(snapshot_streams(tracker), reference, iteration=0)
    assert [m.subject for m in mismatches] == ["cpu"]


def test_compare_streams_detects_a_broken_alias():
    expected, got = RNGStatesTracker("cpu"), RNGStatesTracker("cpu")
    expected.add("a", 1)
    expected.add_alias("b", "a")
    got.add("a", 1)
    got.add("b", 1)  # same value, but a separate object: the alias is broken
    mismatches = compare_streams(snapshot_streams(got), snapshot_streams(expected), iteration=0)
    assert [(m.oracle, m.subject) for m in mismatches] == [("live-stream", "tracker aliases")]
    assert "('a', 'b')" in mismatches[0].detail


def test_compare_streams_reports_a_missing_stream():
    expected, got = RNGStatesTracker("cpu"), RNGStatesTracker("cpu")
    expected.add("mp", 5)
    mismatches = compare_streams(snapshot_streams(got), snapshot_streams(expected), iteration=0)
    assert [(m.subject, m.detail) for m in mismatches] == [
        ("tracker:mp", "missing in checkpointed run")
    ]


def test_tracked_layouts_carry_megatrons_other_stream_names():
    from harness.checkpoint import RNGStatesTracker
    from harness.model.cases import Layout
    from harness.run.workload import OTHER_TRACKED_STREAMS, TRACKED_STREAM, make_tracker_streams

    for layout, names in ((Layout.TRACKED, [TRACKED_STREAM, *OTHER_TRACKED_STREAMS]),
                          (Layout.MIXED, [TRACKED_STREAM, *OTHER_TRACKED_STREAMS]),
                          (Layout.DEFAULT, [TRACKED_STREAM])):
        tracker = RNGStatesTracker("cpu")
        make_tracker_streams(tracker, layout)
        assert list(tracker.names()) == names
    assert TRACKED_STREAM == "model-parallel-rng" and "context-parallel-rng" in OTHER_TRACKED_STREAMS
