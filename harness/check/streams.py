"""Comparing two inventories of live RNG streams (`run.streams` takes them): states bit for bit,
decoded for people (seed, offset), alias groups, and whether every name still resolves to the
same generator object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..results import Mismatch
from .compare import bitwise_diff


@dataclass
class StreamSnapshot:
    """Stream name -> state value, plus the alias groups of the tracker's names."""

    states: dict[str, torch.Tensor]
    alias_groups: tuple[tuple[str, ...], ...]


def identity_mismatches(before: dict[str, Any], after: dict[str, Any], iteration: int) -> list[Mismatch]:
    """Oracle 7: every stream name still resolves to the very object it resolved to before the run
    (live objects are rewound in place: graph registrations and other holders keep the object)."""
    out = []
    for name, obj in before.items():
        if name not in after:
            out.append(Mismatch("identity", name, iteration, 0, 0, detail="the name no longer resolves"))
        elif after[name] is not obj:
            out.append(Mismatch(
                "identity", name, iteration, 0, 0,
                detail="resolves to another generator object than before the run (replaced, not "
                       "rewound in place)",
            ))
    return out


def _state_view(state: torch.Tensor) -> torch.Tensor:
    # Generator states are byte tensors; an int64 view shows a CUDA state as [seed, offset].
    flat = state.reshape(-1)
    if flat.dtype == torch.uint8 and flat.numel() % 8 == 0:
        return flat.view(torch.int64)
    return flat


def compare_streams(got: StreamSnapshot, expected: StreamSnapshot, iteration: int) -> list[Mismatch]:
    """Mismatches between two inventories: missing streams, differing values, broken aliases."""
    out: list[Mismatch] = []
    for name in sorted(set(got.states) | set(expected.states)):
        if name not in got.states or name not in expected.states:
            where = "checkpointed run" if name not in got.states else "reference run"
            out.append(Mismatch("live-stream", name, iteration, 0, 0, detail=f"missing in {where}"))
            continue
        diff = bitwise_diff(
            _state_view(got.states[name]), _state_view(expected.states[name]),
            oracle="live-stream", subject=name, iteration=iteration,
        )
        if diff is not None:
            out.append(_decoded(diff, got.states[name], expected.states[name]))
    if got.alias_groups != expected.alias_groups:
        out.append(Mismatch(
            "live-stream", "tracker aliases", iteration, 0, 0,
            detail=f"alias groups {got.alias_groups}, expected {expected.alias_groups}",
        ))
    return out


def describe_state(state: torch.Tensor) -> str | None:
    """A generator state decoded for people: 'seed 2718, offset 16' for a CUDA Philox state (16
    bytes: seed, offset), 'seed 1234, position 622' for a CPU mt19937 state (its initial seed and
    the count of words left before the next refill); None for anything else."""
    flat = state.reshape(-1)
    if flat.dtype != torch.uint8:
        return None
    if flat.numel() == 16:
        seed, offset = flat.view(torch.int64).tolist()
        return f"seed {seed}, offset {offset}"
    if flat.numel() == 5056:  # CPUGeneratorImplState: initial seed (u64), left (i32), ...
        seed = int(flat[:8].view(torch.int64).item())
        left = int(flat[8:12].view(torch.int32).item())
        return f"seed {seed}, position {left}"
    return None


def _decoded(diff: Mismatch, got: torch.Tensor, expected: torch.Tensor) -> Mismatch:
    """Show both states decoded (seed, offset) where they can be, instead of one raw element."""
    got_text, expected_text = describe_state(got), describe_state(expected)
    if got_text is None or expected_text is None:
        return diff
    if got_text == expected_text:  # same seed and position, other words: the raw element says more
        return Mismatch(**{**diff.__dict__, "detail": f"mt19937 words differ; both at {got_text}"})
    detail = ""
    if got.numel() == 16:
        part = {0: "seed", 1: "offset"}.get(diff.first_index)  # type: ignore[arg-type]
        detail = f"the Philox {part} differs" if part else ""
    return Mismatch(**{**diff.__dict__, "got": got_text, "expected": expected_text, "detail": detail})
