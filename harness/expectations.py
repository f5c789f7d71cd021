"""Expected failures as data (cases/expectations.toml), matched by impl and case-id pattern.

Each entry names an impl (the name the user gives on the command line, an import path
``pkg.mod:factory`` included), one or more `fnmatch` patterns over case ids, a reason and, where one
exists, an upstream issue.  An entry names the failure it expects:

* ``outcome``: ``mismatch`` (the default), ``error``, ``crash`` or ``timeout``;
* ``oracles`` (optional, for ``mismatch``): each of these oracles fails (one bug usually shows in
  several oracles, and which others join in varies from cell to cell, so an entry names the ones
  every matched cell shows: the signature of the bug);
* ``message`` (optional, for the other outcomes): a regular expression that the error text
  matches (``re.search``);
* or ``outcome = "pass"``: the matched cases are expected to pass (an entry that keeps broader
  entries below it from claiming cells where the bug cannot show, e.g. a region that draws
  nothing).  Such a case that fails is a plain failure.

``impl`` may be a list of names (one entry each) or an `fnmatch` pattern (``"neg-*"``).

`judge` turns a result and its entry into a verdict: the expected failure is ``xfail``; a case that
fails differently is ``fail`` ("wrong failure: expected mismatch (live-stream), got error: ...");
a matched case that passes is ``stale``.  An entry whose cases match no case, or whose impl names
no known implementation, is reported (`entry_problems`).

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
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "cases" / "expectations.toml"
FAILURE_OUTCOMES = ("mismatch", "error", "crash", "timeout")
OUTCOMES = ("pass", *FAILURE_OUTCOMES)
ORACLES = ("forward-mask", "recompute-mask", "gradient", "buffer", "live-stream", "fresh-randomness",
           "output", "identity")
ENTRY_KEYS = {"impl", "cases", "reason", "issue", "versions", "outcome", "oracles", "message"}


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
    outcome: str = "mismatch"  # the failure expected: mismatch, error, crash or timeout
    oracles: tuple[str, ...] = ()  # for mismatch: each of these fails (empty: any mismatch)
    message: str = ""  # for error / crash / timeout: a regex the error text matches

    @property
    def expects_pass(self) -> bool:
        """True for an entry that says its cases pass (``outcome = "pass"``)."""
        return self.outcome == "pass"

    def expected(self) -> str:
        """'mismatch (recompute-mask, gradient)' or "error matching 'TypeError'": what it expects."""
        if self.oracles:
            return f"{self.outcome} ({', '.join(self.oracles)})"
        if self.message:
            return f"{self.outcome} matching {self.message!r}"
        return self.outcome

    def explains(self, outcome: str, oracles: Iterable[str], error: str) -> bool:
        """True when a failed case failed exactly the way this entry says."""
        if outcome != self.outcome:
            return False
        if not set(self.oracles) <= set(oracles):
            return False
        return not self.message or re.search(self.message, error or "") is not None

    def matches(self, impl: str, case_id: str) -> bool:
        """Impl and case-id pattern only (the version is `applies_to`'s business)."""
        return fnmatch.fnmatchcase(impl, self.impl) and self.matches_case(case_id)

    def matches_case(self, case_id: str) -> bool:
        """One of the entry's case-id patterns matches `case_id`."""
        return any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def applies_to(self, version: "str | None") -> bool:
        """True for an entry without a range, else when `version` is known and in the range."""
        return not self.versions or version_in(version, self.versions)

    def describe(self) -> str:
        where = f" (versions {self.versions})" if self.versions else ""
        return f"{self.impl}: {', '.join(self.patterns)}{where}"


def _string_list(raw: Any, key: str, where: str) -> tuple[str, ...]:
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ExpectationError(f"{where} {key} must be a string or a list of strings")
    return tuple(values)


def _entry(raw: Mapping[str, Any], where: str) -> Expectation:
    """One [[expect]] table -> `Expectation`; anything malformed is one ExpectationError line."""
    missing = [key for key in ("impl", "cases", "reason") if key not in raw]
    if missing:
        raise ExpectationError(f"{where} lacks {', '.join(missing)}")
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise ExpectationError(f"{where} has unknown key {unknown[0]!r}; keys: {', '.join(sorted(ENTRY_KEYS))}")
    versions = raw.get("versions", "")
    if not isinstance(versions, str):
        raise ExpectationError(
            f"{where} versions must be a string such as \">=0.16,<0.20\", not {type(versions).__name__}"
        )
    try:
        parse_versions(versions)
    except ExpectationError as exc:
        raise ExpectationError(f"{where}: {exc}") from None
    outcome = raw.get("outcome", "mismatch")
    if outcome not in OUTCOMES:
        raise ExpectationError(f"{where} outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    oracles = _string_list(raw["oracles"], "oracles", where) if "oracles" in raw else ()
    bad = [o for o in oracles if o not in ORACLES]
    if bad:
        raise ExpectationError(f"{where} names unknown oracle {bad[0]!r}; oracles: {', '.join(ORACLES)}")
    if oracles and outcome != "mismatch":
        raise ExpectationError(f"{where} names oracles, which only a mismatch has (outcome is {outcome!r})")
    message = raw.get("message", "")
    if not isinstance(message, str):
        raise ExpectationError(f"{where} message must be a string (a regular expression)")
    if message and outcome == "mismatch":
        raise ExpectationError(f"{where} has a message, which a mismatch has not (use oracles)")
    if message and outcome == "pass":
        raise ExpectationError(f"{where} has a message, which a pass entry has not")
    try:
        re.compile(message)
    except re.error as exc:
        raise ExpectationError(f"{where} message {message!r} is not a regular expression: {exc}") from None
    return Expectation(
        raw["impl"], _string_list(raw["cases"], "cases", where), raw["reason"], raw.get("issue", ""),
        versions.strip(), outcome, oracles, message,
    )


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
    return [entry for n, raw in enumerate(data.get("expect", []), start=1)
            for entry in _entries(raw, f"{path}: entry {n}")]


def _entries(raw: Any, where: str) -> list[Expectation]:
    """One [[expect]] table -> its entries: one per impl where ``impl`` is a list of names."""
    if not isinstance(raw, Mapping):
        raise ExpectationError(f"{where} is not a table")
    impl = raw.get("impl")
    if isinstance(impl, list):
        names = _string_list(impl, "impl", where)
        return [_entry({**raw, "impl": name}, where) for name in names]
    return [_entry(raw, where)]


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
    """Entries whose case patterns match none of `case_ids` (dead entries to warn about)."""
    ids = list(case_ids)
    return [e for e in entries if not any(e.matches_case(cid) for cid in ids)]


def entry_problems(entries: Iterable[Expectation], known_impls: Iterable[str] | None = None,
                   case_ids: Iterable[str] | None = None) -> list[str]:
    """One line per entry that can never apply: its impl names no known implementation (a
    registered name; an import path ``pkg.mod:factory`` counts as known), or its case patterns
    match no case of the whole matrix.  Defaults: the registered impls and every generated case."""
    from .cases import generate
    from .impls import registered

    known = set(registered() if known_impls is None else known_impls)
    ids = [c.id for c in generate()] if case_ids is None else list(case_ids)
    entries = list(entries)
    lines = [f"impl matches no known implementation: {e.describe()}"
             for e in entries if ":" not in e.impl and not any(fnmatch.fnmatchcase(k, e.impl) for k in known)]
    lines += [f"cases match no case: {e.describe()}" for e in unmatched(entries, ids)]
    return lines


@dataclass(frozen=True)
class Judgement:
    """How one result counts: its verdict and, where it is not self-evident, why."""

    verdict: str  # pass | fail | xfail | stale | skip
    note: str = ""


def judge(outcome: str, oracles: Iterable[str], error: str, entry: Expectation | None, *,
          impl: str, must_support_all: bool = False, reason: str = "") -> Judgement:
    """The verdict of a result (`outcome`, failing `oracles`, `error` text) under its entry.

    Without an entry: pass -> pass, a failure -> fail, unsupported / skipped -> skip, except that
    an impl that must support every valid case (`must_support_all`) fails an unsupported one.
    With an entry: the failure it names -> xfail; any other failure -> fail ("wrong failure");
    a pass -> stale.
    """
    fired = list(dict.fromkeys(oracles))
    if outcome == "unsupported" and must_support_all:
        return Judgement("fail", f"{impl} must support every valid case of its device, but declared "
                                 f"this one unsupported: {reason}")
    if outcome in ("unsupported", "skipped"):
        return Judgement("skip")
    if entry is None:
        return Judgement("pass" if outcome == "pass" else "fail")
    if entry.expects_pass:
        return Judgement("pass") if outcome == "pass" else Judgement(
            "fail", f"expected to pass ({entry.reason.split(chr(10))[0][:120]}), got {outcome}")
    if outcome == "pass":
        return Judgement("stale", f"stale: expected {entry.expected()}, but the case passed")
    if entry.explains(outcome, fired, error):
        return Judgement("xfail")
    got = f"{outcome} ({', '.join(fired)})" if fired else outcome
    first = (error or "").strip().splitlines()
    if outcome != "mismatch" and first:
        got += f": {first[0]}"
    return Judgement("fail", f"wrong failure: expected {entry.expected()}, got {got}")
