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


def live_generators(tracker: Any) -> list[torch.Generator]:
    """Every live generator a region may draw from: device defaults plus the tracker's streams."""
    gens = device_default_generators()
    if tracker is not None:
        gens.extend(tracker.generators())
    return unique(gens)


class RNGPolicy:
    """Interface of the three RNG moments of a checkpoint (see module docstring)."""

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
        return StateValues.take(self.generators(tracker))

    def rewind(self, snapshot: StateValues) -> StateValues:
        before = StateValues.take(snapshot.generators)
        snapshot.write_back()
        return before

    def restore(self, token: StateValues) -> None:
        token.write_back()
