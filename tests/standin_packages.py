"""Helpers for tests that put stand-in packages (Megatron-core, TransformerEngine, DeepSpeed) first
on sys.path."""

from __future__ import annotations

import sys


def drop_modules(top: str) -> dict[str, object]:
    """Remove package `top` and its submodules from sys.modules; return what was removed, so a
    test can put the real modules back afterwards."""
    dropped = {}
    for name in list(sys.modules):
        if name == top or name.startswith(top + "."):
            dropped[name] = sys.modules.pop(name)
    return dropped
