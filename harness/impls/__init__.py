"""Finding implementations under test by name.

A name is looked up in the entry-point group ``harness.implementations`` (where the shipped impls
are registered too, with a built-in fallback when the package runs from a source tree), or given
as an import path ``package.module:factory``.  A factory returns an `Adapter`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable

from .base import Adapter

ENTRY_POINT_GROUP = "harness.implementations"

BUILTIN: dict[str, str] = {
    "bundled": "harness.impls.bundled:make_bundled",
    "torch": "harness.impls.torch_checkpoint:make_torch",
    "neg-live-handles": "harness.impls.negative:make_live_handles",
    "neg-no-restore": "harness.impls.negative:make_no_restore",
    "neg-ignore-tracker": "harness.impls.negative:make_ignore_tracker",
    "neg-no-rewind": "harness.impls.negative:make_no_rewind",
    "neg-host-values": "harness.impls.negative:make_host_values",
    # External implementations: they load whether or not the package is installed, and declare
    # every case unsupported (with the import error) when it does not import.
    "megatron": "harness.impls.megatron:make_megatron",
    "megatron-graphsafe": "harness.impls.megatron:make_megatron_graphsafe",
    "transformer-engine": "harness.impls.transformer_engine:make_transformer_engine",
}
NEGATIVE_CONTROLS = tuple(name for name in BUILTIN if name.startswith("neg-"))


class ImplError(ValueError):
    """An implementation that cannot be found or built; the message is one line for the user."""


def registered() -> dict[str, str]:
    """Name -> 'module:factory' for every known implementation (entry points override built-ins)."""
    names = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names[ep.name] = ep.value
    return names


def _import_factory(path: str) -> Callable[[], Adapter]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ImplError(f"bad implementation path {path!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImplError(f"cannot import {module_name!r} for implementation {path!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ImplError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise ImplError(f"{path} is a {type(factory).__name__}, not a factory function")
    return factory


def load(name: str) -> Adapter:
    """The adapter for a registered name or a ``module:factory`` path; unknown -> `ImplError`."""
    known = registered()
    if name in known:
        path = known[name]
    elif ":" in name:
        path = name
    else:
        raise ImplError(f"unknown implementation {name!r}; known: {', '.join(sorted(known))} "
                        "(or give package.module:factory)")
    factory = _import_factory(path)
    try:
        adapter = factory()
    except Exception as exc:  # a broken third-party factory is bad input, not a harness crash
        raise ImplError(f"factory {path} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(adapter, Adapter) and not callable(getattr(adapter, "checkpoint", None)):
        raise ImplError(f"{path} did not return an adapter (got {type(adapter).__name__})")
    if not getattr(adapter, "name", None) or getattr(adapter, "name") == "unnamed":
        adapter.name = name
    return adapter


def parse_impl_names(values: list[str] | str | None, default: str = "bundled") -> list[str]:
    """Flatten repeatable / comma-separated impl options into a de-duplicated list of names."""
    if not values:
        return [default]
    if isinstance(values, str):
        values = [values]
    names: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if name == "all":
                names.extend(n for n in BUILTIN if n not in names)
            elif name and name not in names:
                names.append(name)
    return names or [default]
