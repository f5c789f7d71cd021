"""Comparing two snapshots of ambient state (`run.ambient` takes them): SDPA backend flags,
default dtype, deterministic mode, autocast, cuDNN flags, the current CUDA stream's role."""

from __future__ import annotations

from typing import Any


def differences(got: dict[str, Any], expected: dict[str, Any]) -> dict[str, str]:
    """Piece name -> 'name: got X, expected Y' for every piece that differs (a piece one side
    lacks counts), in the expected state's order."""
    missing = object()
    lines = {}
    for name in dict.fromkeys([*expected, *got]):
        a, b = got.get(name, missing), expected.get(name, missing)
        if a != b:
            lines[name] = f"{name}: got {_shown(a, missing)}, expected {_shown(b, missing)}"
    return lines


def _shown(value: Any, missing: object) -> str:
    return "(not read)" if value is missing else str(value)
