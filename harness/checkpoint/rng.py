"""Saving and rewinding RNG state around a checkpointed region.

A `RNGPolicy` owns the three moments a checkpoint touches RNG state:

* `snapshot(tracker)` at region entry;
* `rewind(snapshot)` just before the recompute, returning a token;
* `restore(token)` just after the recompute.

`ValuePolicy` is the correct one: it copies **values** (`Generator.get_state`) of every live
generator (CPU, every CUDA device, every distinct tracker stream) and writes them back into the
same live objects with `set_state`, so identities, aliases and graph registrations stay valid.
Negative controls subclass it with one deliberate bug each (`harness.impls.negative`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .generators import device_default_generators, unique


@dataclass
class StateValues:
    """Value copies of a set of live generators, taken at one moment."""

    entries: list[tuple[torch.Generator, torch.Tensor]]

    @classmethod
    def take(cls, generators: Sequence[torch.Generator]) -> "StateValues":
        """Copy the current state value of each generator (no handles, no `clone_state`)."""
        return cls([(gen, gen.get_state()) for gen in generators])

    @property
    def generators(self) -> list[torch.Generator]:
        return [gen for gen, _ in self.entries]

    def write_back(self) -> None:
        """Write the saved values into the same live generator objects, in place."""
        for gen, value in self.entries:
            gen.set_state(value)


def _capturing() -> bool:
    # is_initialized, not is_available: nothing captures before CUDA is initialised, and it is
    # the cheaper question (is_available reads the environment), asked at every drawing site.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def live_generators(tracker: Any) -> list[torch.Generator]:
    """Every live generator a region may draw from: device defaults plus the tracker's streams."""
    gens = device_default_generators()
    if tracker is not None:
        gens.extend(tracker.generators())
    return unique(gens)


CAPTURE_STRATEGIES = ("auto", "stash", "values")


class CaptureStrategyError(RuntimeError):
    """No sound strategy applies under capture; names the API that is missing."""


class RNGPolicy:
    """Interface of the three RNG moments of a checkpoint (see module docstring).

    Under CUDA-graph capture the policy also decides whether the region keeps its RNG outputs
    (`stash_under_capture`), in which case the recompute replays them and no rewind happens.
    """

    capture_strategy = "auto"

    def stash_under_capture(self) -> bool:
        """True when a region captured now should keep its RNG outputs instead of redrawing.

        'values' rewinds with capture-relative `get_state`/`set_state` (torch >= 2.10): right when
        forward and recompute share one graph, wrong across separate graphs.  'stash' never
        redraws and is sound in both.  'auto' picks 'stash', the strategy that is sound whichever
        graph the recompute lands in.
        """
        return self.capture_strategy in ("auto", "stash")

    def snapshot(self, tracker: Any) -> Any:
        raise NotImplementedError

    def rewind(self, snapshot: Any) -> Any:
        raise NotImplementedError

    def restore(self, token: Any) -> None:
        raise NotImplementedError


class ValuePolicy(RNGPolicy):
    """Correct: snapshot values; rewind in place; put back the pre-recompute values afterwards."""

    def generators(self, tracker: Any) -> list[torch.Generator]:
        """The generators this policy saves for a region run with `tracker`."""
        return live_generators(tracker)

    def snapshot(self, tracker: Any) -> StateValues:
        try:
            return StateValues.take(self.generators(tracker))
        except RuntimeError as exc:
            if not _capturing():
                raise
            raise CaptureStrategyError(
                "capture strategy 'values' needs Generator.get_state during CUDA graph capture "
                f"(torch >= 2.10); this build raised: {exc}"
            ) from None

    def rewind(self, snapshot: StateValues) -> StateValues:
        before = StateValues.take(snapshot.generators)
        try:
            snapshot.write_back()
        except Exception:
            before.write_back()  # leave no generator half-rewound
            raise
        return before

    def restore(self, token: StateValues) -> None:
        token.write_back()
