"""What other installed packages add to the harness, through two entry-point groups:

- ``harness.implementations``: ``name = "pkg.module:factory"``, an impl by name (a factory returning
  an adapter), shown by ``list --impls`` and loadable by name in the CLI and under pytest;
- ``harness.expectations``: ``name = "pkg.module:ATTRIBUTE"``, an expectations file (the attribute
  is its path: a `str`, a `pathlib.Path` or an `importlib.resources` Traversable) whose entries are
  added to the shipped ones.  A package's entries are for the impls it registers itself; the
  shipped impls' known bugs are the shipped file's business.

Only the standard library here: the report readers and the pytest entry point may import it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from .errors import UsageError

IMPLS_GROUP = "harness.implementations"
EXPECTATIONS_GROUP = "harness.expectations"


@dataclass(frozen=True)
class Registration:
    """One entry point: its name, its value ('pkg.module:attr') and the package that declares it."""

    name: str
    value: str
    package: str  # the distribution's name ('' when the entry point has none)
    version: str  # the distribution's version ('' when unknown)

    @property
    def origin(self) -> str:
        """'package version', for messages and records."""
        return f"{self.package} {self.version}".strip() or "an unnamed package"


def _registration(ep: EntryPoint) -> Registration:
    dist = getattr(ep, "dist", None)
    package = str(dist.metadata["Name"] or "") if dist is not None else ""
    version = str(dist.version or "") if dist is not None else ""
    return Registration(ep.name, ep.value, package, version)


def impls() -> dict[str, Registration]:
    """Name -> registration of every impl an installed package registers (the last of one name wins)."""
    return {ep.name: _registration(ep) for ep in entry_points(group=IMPLS_GROUP)}


def expectation_sources() -> list[Registration]:
    """Every expectations file an installed package registers, in a stable order (package, name)."""
    found = [_registration(ep) for ep in entry_points(group=EXPECTATIONS_GROUP)]
    return sorted(found, key=lambda reg: (reg.package, reg.name))


def impls_of(package: str) -> set[str]:
    """The impl names `package` registers."""
    return {name for name, reg in impls().items() if reg.package == package}


class EntryPointError(UsageError):
    """An entry point that cannot be used (bad input from an installed package); one line."""


def expectations_path(reg: Registration) -> Path:
    """The file an expectations entry point names: its object, imported, read as a path."""
    module_name, _, attr = reg.value.partition(":")
    if not module_name or not attr:
        raise EntryPointError(f"{reg.origin}: entry point {EXPECTATIONS_GROUP} {reg.name} = {reg.value!r}: "
                              "expected package.module:ATTRIBUTE (the attribute holds the file's path)")
    try:
        target = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (Exception, SystemExit) as exc:  # a broken package is bad input, not a traceback
        raise EntryPointError(f"{reg.origin}: entry point {EXPECTATIONS_GROUP} {reg.name} = {reg.value!r} "
                              f"cannot be loaded: {type(exc).__name__}: {exc}") from None
    if not isinstance(target, (str, Path)) and not hasattr(target, "read_text"):
        raise EntryPointError(f"{reg.origin}: entry point {EXPECTATIONS_GROUP} {reg.name} = {reg.value!r} "
                              f"is a {type(target).__name__}, not the path of a file")
    return Path(str(target))
