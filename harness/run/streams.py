"""Stream inventory: value snapshots of every live RNG stream (`check.streams` compares them).

A stream is the default generator of a device (``cpu``, ``cuda:0`` ...) or a named tracker stream
(``tracker:NAME``).  Tracker aliases are part of the inventory: a checkpoint that breaks an alias
(two names that shared one state object no longer do) is as wrong as one that moves a state.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..check.streams import StreamSnapshot
from ..checkpoint.generators import device_default_generators


def state_value(value: Any) -> torch.Tensor:
    """Trackers may hand out state tensors or generator objects; reduce both to a value copy."""
    if isinstance(value, torch.Generator):
        return value.get_state()
    return value.detach().clone()


def _device_name(gen: torch.Generator) -> str:
    device = gen.device
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else 0}"
    return device.type


def stream_objects(tracker: Any) -> dict[str, Any]:
    """``tracker:NAME`` -> the state object behind each tracker name (for trackers that expose
    `generator(name)`; empty otherwise).  The dict holds the objects, so their identities stay
    meaningful for as long as it lives."""
    if tracker is None or not hasattr(tracker, "generator"):
        return {}
    return {f"tracker:{name}": tracker.generator(name) for name in tracker.names()}


def alias_groups(tracker: Any) -> tuple[tuple[str, ...], ...]:
    """Groups of tracker names that share one state object (only groups of two or more)."""
    objects = stream_objects(tracker)  # held while grouping: `is` on live objects, never a stale id()
    groups: list[tuple[Any, list[str]]] = []
    for key, obj in objects.items():
        name = key.removeprefix("tracker:")
        group = next((names for held, names in groups if held is obj), None)
        if group is None:
            groups.append((obj, [name]))
        else:
            group.append(name)
    return tuple(sorted(tuple(names) for _, names in groups if len(names) > 1))


def snapshot_streams(tracker: Any) -> StreamSnapshot:
    """Value copies of every live stream: device defaults and each tracker name."""
    states = {_device_name(gen): gen.get_state() for gen in device_default_generators()}
    if tracker is not None:
        for name, value in tracker.get_states().items():
            states[f"tracker:{name}"] = state_value(value)
    return StreamSnapshot(states, alias_groups(tracker))


@contextlib.contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Put every device default generator back as it was, object and value, on exit.

    A faulty implementation may leave a default generator pointed at another state object (a
    graph-safe swap it never undid); the handle is restored before the value so the next case
    starts clean.
    """
    gens = device_default_generators()
    handles = [
        gen.graphsafe_get_state() if gen.device.type == "cuda" and hasattr(gen, "graphsafe_get_state") else None
        for gen in gens
    ]
    values = [gen.get_state() for gen in gens]
    try:
        yield
    finally:
        for gen, handle, value in zip(gens, handles, values):
            if handle is not None:
                gen.graphsafe_set_state(handle)
            gen.set_state(value)
