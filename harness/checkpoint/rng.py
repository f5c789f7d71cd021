"""Saving and rewinding RNG state around a checkpointed region.

A `RNGPolicy` owns the three moments a checkpoint touches RNG state:

* `snapshot(tracker)` at region entry;
* `rewind(snapshot)` just before the recompute, returning a token;
* `restore(token)` just after the recompute.

`ValuePolicy` is the correct one: it copies **values** (`Generator.get_state`) of every live
generator (CPU, every CUDA device, every distinct tracker stream) and writes them back into the
same live objects with `set_state`, so identities, aliases and graph registrations stay valid.
Negative controls subclass it with one deliberate bug each (`harness.impls.negative`).

Under CUDA-graph capture a host value is capture-relative: `get_state` gives the seed and the
*intragraph* offset, while the graph's base offset lives in device tensors that every replay
refills.  A redraw in another graph (separate forward and backward graphs) starts from that
graph's base, so host values alone cannot line it up (`values` is sound in one graph only).  The
`philox` strategy (torch >= 2.14, `Generator.philox_state`) also copies the capturing graph's
device seed and base offset at region entry, with copy kernels that run at every replay, and
writes them into the recompute's graph for the recompute (`PhiloxValues`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .generators import device_default_generators, unique


class CaptureStrategyError(RuntimeError):
    """No sound strategy applies under capture; names the API that is missing."""


@dataclass
class StateValues:
    """Value copies of a set of live generators, taken at one moment."""

    entries: list[tuple[torch.Generator, torch.Tensor]]

    @classmethod
    def take(cls, generators: Sequence[torch.Generator]) -> "StateValues":
        """Copy the current state value of each generator (no handles, no `clone_state`)."""
        return cls([(gen, gen.get_state()) for gen in generators])

    def retake(self) -> "StateValues":
        """The same generators' values now, in the same kind of record (what a rewind puts back)."""
        return type(self).take(self.generators)

    @property
    def generators(self) -> list[torch.Generator]:
        return [gen for gen, _ in self.entries]

    def write_back(self) -> None:
        """Write the saved values into the same live generator objects, in place."""
        for gen, value in self.entries:
            gen.set_state(value)


def philox_available() -> bool:
    """True where this torch has `Generator.philox_state` (torch >= 2.14), found by capability."""
    return hasattr(torch.Generator, "philox_state")


def capture_philox(gen: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The device tensors that hold `gen`'s Philox seed and base offset in the CUDA graph being
    captured now (`philox_state(0)`: reserves nothing; during capture its seed and offset alias the
    graph's tensors, refilled by every replay), or None where `gen` is not drawn through a capture
    (a CPU generator, a device that is not capturing: its values are host values)."""
    if getattr(gen, "device", None) is None or gen.device.type != "cuda":
        return None
    seed, offset, _intragraph = gen.philox_state(0)
    if not seed.is_cuda:  # eager answer: CPU tensors of the host values, already in get_state
        return None
    return seed, offset


@dataclass
class PhiloxValues(StateValues):
    """Host values (`StateValues`) plus, for each generator drawn through the capture under way,
    copies of that graph's device seed and base offset (`capture_philox`).

    The copies are captured kernels: at every replay they hold the values of that replay.
    Writing back copies them into the aliases of the graph being captured at that moment (for a
    recompute, the backward graph's) and sets the host value (the intragraph offset), so the
    recompute's kernels read the forward's seed and offset exactly; no offset arithmetic."""

    device: list[tuple[torch.Generator, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def take(cls, generators: Sequence[torch.Generator]) -> "PhiloxValues":
        """Host values of every generator and device copies of the capturing ones' seed and offset."""
        if not philox_available():
            raise CaptureStrategyError(
                "capture strategy 'philox' needs Generator.philox_state (torch >= 2.14); this build has none")
        device = []
        for gen in generators:
            aliases = capture_philox(gen)
            if aliases is not None:
                device.append((gen, aliases[0].clone(), aliases[1].clone()))
        return cls([(gen, gen.get_state()) for gen in generators], device)

    def write_back(self) -> None:
        """Host values into the live generators; device seed and offset into the aliases of the
        graph being captured now."""
        super().write_back()
        for gen, seed, offset in self.device:
            aliases = capture_philox(gen)
            if aliases is None:
                raise CaptureStrategyError(
                    "a philox snapshot taken during capture is written back outside one: the region's "
                    "forward was captured and its recompute is not")
            aliases[0].copy_(seed)
            aliases[1].copy_(offset)


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


CAPTURE_STRATEGIES = ("auto", "stash", "values", "philox")


def resolve_capture_strategy(name: str) -> str:
    """The strategy `name` stands for on this torch: 'auto' is 'philox' where
    `Generator.philox_state` exists (a real rewind, no kept outputs), else 'stash' (sound across
    separate graphs on any torch with CUDA graphs); the others stand for themselves."""
    if name not in CAPTURE_STRATEGIES:
        raise ValueError(f"unknown capture_strategy {name!r}; valid: {', '.join(CAPTURE_STRATEGIES)}")
    if name == "auto":
        return "philox" if philox_available() else "stash"
    return name


class RNGPolicy:
    """Interface of the three RNG moments of a checkpoint (see module docstring).

    Under CUDA-graph capture the policy also decides whether the region keeps its RNG outputs
    (`stash_under_capture`), in which case the recompute replays them and no rewind happens.
    """

    capture_strategy = "auto"

    def strategy(self) -> str:
        """The capture strategy this policy uses on this torch (`resolve_capture_strategy`)."""
        return resolve_capture_strategy(self.capture_strategy)

    def stash_under_capture(self) -> bool:
        """True when a region captured now should keep its RNG outputs instead of redrawing.

        'values' rewinds with capture-relative `get_state`/`set_state` (torch >= 2.10): right when
        forward and recompute share one graph, wrong across separate graphs.  'philox' also
        rewinds the graph's device seed and offset (torch >= 2.14) and 'stash' never redraws: both
        are sound in either.  'auto' is 'philox' where it exists, else 'stash'.
        """
        return self.strategy() == "stash"

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
        capturing = _capturing()
        record = PhiloxValues if capturing and self.strategy() == "philox" else StateValues
        try:
            return record.take(self.generators(tracker))
        except CaptureStrategyError:
            raise
        except RuntimeError as exc:
            if not capturing:
                raise
            raise CaptureStrategyError(
                f"capture strategy {self.strategy()!r} needs Generator.get_state during CUDA graph capture "
                f"(torch >= 2.10); this build raised: {exc}"
            ) from None

    def rewind(self, snapshot: StateValues) -> StateValues:
        before = snapshot.retake()
        try:
            snapshot.write_back()
        except Exception:
            before.write_back()  # leave no generator half-rewound
            raise
        return before

    def restore(self, token: StateValues) -> None:
        token.write_back()
