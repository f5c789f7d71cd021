"""Negative controls: copies of `bundled` with one known RNG bug each.

The harness's own tests assert that every control is caught, and in which cells.  A harness that
cannot fail them is worthless.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checkpoint.generators import device_default_generators
from ..checkpoint.rng import ValuePolicy, live_generators
from .base import Adapter
from .bundled import BundledAdapter


def _handle(gen: torch.Generator) -> Any:
    """A live handle: a graph-safe alias of the state where torch has one, else the object itself."""
    if gen.device.type == "cuda" and hasattr(gen, "graphsafe_get_state"):
        return gen.graphsafe_get_state()
    return gen


def _point_at(gen: torch.Generator, handle: Any) -> None:
    """'Restore' from a handle: both forms share the live state, so this changes nothing."""
    if handle is gen:
        gen.set_state(handle.get_state())
    else:
        gen.graphsafe_set_state(handle)


class LiveHandlePolicy(ValuePolicy):
    """Bug: saves live generator handles (TransformerEngine #3833, Megatron graph-safe tracker).

    Forward advances the state the handles share, so the recompute draws at a later offset and the
    'restore afterwards' is a no-op too.
    """

    def snapshot(self, tracker: Any) -> list[tuple[torch.Generator, Any]]:
        return [(gen, _handle(gen)) for gen in live_generators(tracker)]

    def rewind(self, snapshot: list[tuple[torch.Generator, Any]]) -> Any:
        before = [(gen, _handle(gen)) for gen, _ in snapshot]
        for gen, handle in snapshot:
            _point_at(gen, handle)
        return before

    def restore(self, token: list[tuple[torch.Generator, Any]]) -> None:
        for gen, handle in token:
            _point_at(gen, handle)


class NoRestorePolicy(ValuePolicy):
    """Bug: rewinds for the recompute but leaves the streams where the recompute left them."""

    def restore(self, token: Any) -> None:
        pass


class IgnoreTrackerPolicy(ValuePolicy):
    """Bug: saves only the device default generators, never the tracker's streams."""

    def generators(self, tracker: Any) -> list[torch.Generator]:
        return device_default_generators()


class NoRewindPolicy(ValuePolicy):
    """Bug: does not rewind at all (as with `preserve_rng_state=False`)."""

    def rewind(self, snapshot: Any) -> Any:
        return None

    def restore(self, token: Any) -> None:
        pass


def _control(name: str, policy: ValuePolicy, description: str) -> Adapter:
    # Under capture the controls rewind with values too, so their bug is exercised in graphs.
    policy.capture_strategy = "values"
    adapter = BundledAdapter()
    adapter.name, adapter.policy, adapter.description = name, policy, description
    return adapter


def make_live_handles() -> Adapter:
    return _control("neg-live-handles", LiveHandlePolicy(), "saves live generator handles, not values")


def make_no_restore() -> Adapter:
    return _control("neg-no-restore", NoRestorePolicy(), "does not restore live streams after recompute")


def make_ignore_tracker() -> Adapter:
    return _control("neg-ignore-tracker", IgnoreTrackerPolicy(), "ignores tracker streams")


def make_host_values() -> Adapter:
    return _control(
        "neg-host-values", ValuePolicy(),
        "rewinds with capture-relative host-side values: right in one graph, wrong across separate graphs",
    )


def make_no_rewind() -> Adapter:
    return _control("neg-no-rewind", NoRewindPolicy(), "never rewinds for the recompute")
