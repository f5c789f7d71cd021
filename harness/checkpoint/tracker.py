"""An RNG states tracker with TransformerEngine / Megatron-core `CudaRNGStatesTracker` semantics.

Named streams are `torch.Generator` objects; an alias is a second name for the same object.
`fork(name)` makes every RNG op on the tracker's device draw from that stream for the duration:

* graph-safe mode (CUDA, where `Generator.graphsafe_set_state` exists): the device's default
  generator is pointed at the stream's state object, so draws advance the stream directly and CUDA
  graphs that registered the stream see the same object;
* value mode (CPU, or when graph-safe swapping is unavailable): the stream's value is copied into
  the default generator and copied back on exit.

Only `get_state`/`set_state` are used, never `clone_state` or `get_offset`, so the same code is
usable while a CUDA graph is being captured.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import torch

from .generators import default_generator, unique


class TrackerError(KeyError):
    """An unknown or duplicate stream name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class RNGStatesTracker:
    """Registry of named RNG streams on one device, with `fork(name)`."""

    def __init__(self, device: "torch.device | str", graphsafe: bool | None = None) -> None:
        self.device = torch.device(device)
        live = default_generator(self.device)
        capable = self.device.type == "cuda" and hasattr(live, "graphsafe_set_state")
        if graphsafe and not capable:
            raise ValueError(f"graph-safe forking is not available for {self.device}")
        self.graphsafe = capable if graphsafe is None else graphsafe
        self._streams: dict[str, torch.Generator] = {}

    def add(self, name: str, seed: int) -> torch.Generator:
        """Create stream `name` seeded with `seed`; a name may be added once."""
        if name in self._streams:
            raise TrackerError(f"RNG stream {name!r} already exists")
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        self._streams[name] = gen
        return gen

    def add_alias(self, alias: str, name: str) -> None:
        """Make `alias` a second name for the very same state object as `name`."""
        if alias in self._streams:
            raise TrackerError(f"RNG stream {alias!r} already exists")
        self._streams[alias] = self._stream(name)

    def names(self) -> list[str]:
        """Every stream name, aliases included, in insertion order."""
        return list(self._streams)

    def generator(self, name: str) -> torch.Generator:
        """The generator object behind `name` (shared by its aliases)."""
        return self._stream(name)

    def generators(self) -> list[torch.Generator]:
        """The distinct state objects, each once however many names alias it."""
        return unique(self._streams.values())

    def get_states(self) -> dict[str, torch.Tensor]:
        """Name -> a value copy of that stream's state (aliases give equal values)."""
        return {name: gen.get_state() for name, gen in self._streams.items()}

    def set_states(self, states: Mapping[str, torch.Tensor]) -> None:
        """Write values into the existing stream objects in place (identities and aliases kept)."""
        for name, value in states.items():
            self._stream(name).set_state(value)

    @contextlib.contextmanager
    def fork(self, name: str) -> Iterator[None]:
        """Make RNG ops on the tracker's device draw from stream `name` inside the block."""
        stream = self._stream(name)
        live = default_generator(self.device)
        if self.graphsafe:
            original = live.graphsafe_get_state()  # a handle to the default state object
            live.graphsafe_set_state(stream)
            try:
                yield
            finally:
                live.graphsafe_set_state(original)
        else:
            original_value = live.get_state()
            live.set_state(stream.get_state())
            try:
                yield
            finally:
                stream.set_state(live.get_state())
                live.set_state(original_value)

    def _stream(self, name: str) -> torch.Generator:
        try:
            return self._streams[name]
        except KeyError:
            raise TrackerError(
                f"unknown RNG stream {name!r}; known: {', '.join(self._streams) or 'none'}"
            ) from None
