"""Expected failures as data (cases/expectations.toml), matched by impl and case-id pattern.

Each entry names an impl, one or more `fnmatch` patterns over case ids, a reason and, where one
exists, an upstream issue.  An entry means "this cell does not pass" (mismatch or error).  A
matched case that passes is a stale entry; an entry that matches no generated case is a warning.

An entry may also name the impl versions it applies to, as a PEP 440 specifier set
(``versions = ">=0.16,<0.20"``).  Such an entry matches only when the version under test is known
and inside the range, so once a release with the fix is under test the cell is no longer expected
to fail and a pass shows as a pass, not as a silently kept xfail.  An entry without `versions`
applies to every version.  Pre-releases and dev builds count by their place in PEP 440 order
(``0.20.0rc1`` is not ``<0.20``, ``0.19.3.dev0`` is ``>=0.19``); a version string that is not
PEP 440 counts as unknown.
"""

from __future__ import annotations

import fnmatch
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "cases" / "expectations.toml"


class ExpectationError(ValueError):
    """A malformed expectations file; the message is one line for the user."""


@functools.lru_cache(maxsize=None)
def parse_versions(spec: str) -> SpecifierSet:
    """A PEP 440 specifier set; a bad one raises `ExpectationError` (one line)."""
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise ExpectationError(f"bad versions specifier {spec!r}: {exc}") from None


def version_in(version: "str | None", spec: str) -> bool:
    """True when `version` is known, valid PEP 440, and inside `spec` (pre-releases included)."""
    if version is None or not str(version).strip():
        return False
    try:
        parsed = Version(str(version).strip())
    except InvalidVersion:
        return False
    return parse_versions(spec).contains(parsed, prereleases=True)


@dataclass(frozen=True)
class Expectation:
    impl: str
    patterns: tuple[str, ...]
    reason: str
    issue: str = ""
    versions: str = ""  # PEP 440 specifier set; empty = every version

    def matches(self, impl: str, case_id: str) -> bool:
        """Impl and case-id pattern only (the version is `applies_to`'s business)."""
        return impl == self.impl and any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def applies_to(self, version: "str | None") -> bool:
        """True for an entry without a range, else when `version` is known and in the range."""
        return not self.versions or version_in(version, self.versions)

    def describe(self) -> str:
        where = f" (versions {self.versions})" if self.versions else ""
        return f"{self.impl}: {', '.join(self.patterns)}{where}"


def load(path: "str | Path | None" = None) -> list[Expectation]:
    """Parse the expectations file; a missing default file means no expectations."""
    path = Path(path) if path else DEFAULT_PATH
    if not path.exists():
        if path == DEFAULT_PATH:
            return []
        raise ExpectationError(f"expectations file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExpectationError(f"cannot read expectations file {path}: {exc}") from None
    entries = []
    for n, raw in enumerate(data.get("expect", []), start=1):
        missing = [key for key in ("impl", "cases", "reason") if key not in raw]
        if missing:
            raise ExpectationError(f"{path}: entry {n} lacks {', '.join(missing)}")
        patterns = raw["cases"] if isinstance(raw["cases"], list) else [raw["cases"]]
        versions = raw.get("versions", "")
        if not isinstance(versions, str):
            raise ExpectationError(
                f"{path}: entry {n} versions must be a string such as \">=0.16,<0.20\", "
                f"not {type(versions).__name__}"
            )
        try:
            parse_versions(versions)
        except ExpectationError as exc:
            raise ExpectationError(f"{path}: entry {n}: {exc}") from None
        entries.append(Expectation(
            raw["impl"], tuple(patterns), raw["reason"], raw.get("issue", ""), versions.strip(),
        ))
    return entries


def find(
    entries: Iterable[Expectation], impl: str, case_id: str, version: "str | None" = None
) -> Expectation | None:
    """The first entry expecting `impl` (at `version`) to fail `case_id`, or None.

    `version` is the impl's version (`adapter.version`); entries with a `versions` range match
    only when it is known and in range, entries without one match whatever it is.
    """
    for entry in entries:
        if entry.matches(impl, case_id) and entry.applies_to(version):
            return entry
    return None


def unmatched(entries: Iterable[Expectation], case_ids: Iterable[str]) -> list[Expectation]:
    """Entries that match none of `case_ids` for their impl (dead entries to warn about)."""
    ids = list(case_ids)
    return [e for e in entries if not any(e.matches(e.impl, cid) for cid in ids)]
