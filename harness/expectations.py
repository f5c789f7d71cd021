"""Expected failures as data (cases/expectations.toml), matched by impl and case-id pattern.

Each entry names an impl, one or more `fnmatch` patterns over case ids, a reason and, where one
exists, an upstream issue.  An entry means "this cell does not pass" (mismatch or error).  A
matched case that passes is a stale entry; an entry that matches no generated case is a warning.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "cases" / "expectations.toml"


class ExpectationError(ValueError):
    """A malformed expectations file; the message is one line for the user."""


@dataclass(frozen=True)
class Expectation:
    impl: str
    patterns: tuple[str, ...]
    reason: str
    issue: str = ""

    def matches(self, impl: str, case_id: str) -> bool:
        return impl == self.impl and any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def describe(self) -> str:
        return f"{self.impl}: {', '.join(self.patterns)}"


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
        entries.append(Expectation(raw["impl"], tuple(patterns), raw["reason"], raw.get("issue", "")))
    return entries


def find(entries: Iterable[Expectation], impl: str, case_id: str) -> Expectation | None:
    """The first entry expecting `impl` to fail `case_id`, or None."""
    for entry in entries:
        if entry.matches(impl, case_id):
            return entry
    return None


def unmatched(entries: Iterable[Expectation], case_ids: Iterable[str]) -> list[Expectation]:
    """Entries that match none of `case_ids` for their impl (dead entries to warn about)."""
    ids = list(case_ids)
    return [e for e in entries if not any(e.matches(e.impl, cid) for cid in ids)]
