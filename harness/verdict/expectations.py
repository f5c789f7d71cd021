"""Expected failures as data (cases/expectations.toml), matched by impl and by what a case does.

Each entry names an impl (the name the user gives on the command line, an import path
``pkg.mod:factory`` included), the cases it covers, a reason and, where one exists, an upstream
issue.  The cases are named by facts (`harness.model.case_facts`: the mode, layout, capture,
interleave and device, and what the program does: which ops it draws inside, outside or nested in
regions, how a region is entered, whether a tracked stream is drawn inside a region...), by
`fnmatch` patterns over case ids (``cases``), or both: a case matches when every fact holds and,
where patterns are given, one of them matches its id.  ``unless`` (a table of facts, or a list of
them) takes cases out again: a case for which every fact of one ``unless`` table holds does not
match (another bug fires first there, say).  Facts cover named and spec programs alike,
so one bug is one entry; an optional ``name`` names the bug (fuzz reports count known failures by
it).  An entry names the failure it expects:

* ``outcome``: ``mismatch`` (the default), ``error``, ``crash`` or ``timeout``, or a list of them
  (one bug that shows as an error in some programs and as a mismatch in others);
* ``oracles`` (optional, for a ``mismatch``): each of these oracles fails (one bug usually shows in
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
a matched case that passes is ``stale``.  An entry whose cases match no case, whose impl names no
known implementation, or that claims a case another entry claims with another expected failure (a
conflict: the first would win silently) is reported (`entry_problems`).  `explain` says which
entry matches a case and why the others do not.

An entry may also name the impl versions it applies to, as a PEP 440 specifier set
(``versions = ">=0.16,<0.20"``).  Such an entry matches only when the version under test is known
and inside the range, so once a release with the fix is under test the cell is no longer expected
to fail and a pass shows as a pass, not as a silently kept xfail.  An entry without `versions`
applies to every version.  Pre-releases and dev builds count by their place in PEP 440 order
(``0.20.0rc1`` is not ``<0.20``, ``0.19.3.dev0`` is ``>=0.19``); a version string that is not
PEP 440 counts as unknown.

An entry may name a ``model`` instead of ``outcome`` / ``oracles`` / ``message``: a behaviour of
`models` with parameters, which says case by case whether and how the impl fails (its facts and
patterns then only scope it).  The models of every entry of an impl that applies to a case compose
(`models.predict`); `find` asks them together at the first of them in the file, and returns the
deciding entry carrying the prediction as its expected failure.

``beyond_matrix = true`` marks an entry whose cells lie outside the default matrices (a shape the
fuzzer found): that it matches none of them is then no sign of a dead entry.

``torch = ">=2.14"`` does the same for the torch under test (``torch.__version__`` where the case
is judged), for an impl whose own version is not torch's: the bundled checkpoint and its controls
behave differently where torch's RNG under capture changed (per-capture Philox state).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import data as shipped_data
from ..errors import UsageError
from ..model.case_facts import FACT_KEYS, check_facts, missed
from ..model.matrix import generate
from ..results import FAILED_OUTCOMES, ORACLES
from .models import LOCAL, Machine, Model, ModelError, Prediction, parse_model, predict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_PATH = shipped_data.path(shipped_data.EXPECTATIONS)
OUTCOMES = ("pass", *FAILED_OUTCOMES)  # what an entry may expect
ENTRY_KEYS = {"impl", "cases", "reason", "issue", "versions", "torch", "outcome", "oracles", "message", "name",
              "unless", "model", "ranks", "beyond_matrix", *FACT_KEYS}
MODEL_DECIDES = ("outcome", "oracles", "message")  # what a model entry may not say: its model says it


class ExpectationError(UsageError):
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


def _case(case: Any) -> Any:
    """A `Case` for `case` (a Case, or a case id); None for an id that names no case (a module
    run's record): only pattern-only entries can match such an id."""
    if not isinstance(case, str):
        return case
    from ..model.cases import CaseError, parse_case_id

    try:
        return parse_case_id(case)
    except (CaseError, ValueError):
        return None


@dataclass(frozen=True)
class Expectation:
    impl: str
    patterns: tuple[str, ...]
    reason: str
    issue: str = ""
    versions: str = ""  # PEP 440 specifier set; empty = every version
    outcomes: tuple[str, ...] = ("mismatch",)  # the failures expected (or ("pass",))
    oracles: tuple[str, ...] = ()  # for mismatch: each of these fails (empty: any mismatch)
    message: str = ""  # for error / crash / timeout: a regex the error text matches
    facts: tuple[tuple[str, Any], ...] = ()  # `case_facts` keys and wanted values, all must hold
    unless: tuple[tuple[tuple[str, Any], ...], ...] = ()  # fact sets that take a case out again
    name: str = ""  # the bug's name
    number: int = 0  # the entry's place in its file (1-based)
    torch: str = ""  # PEP 440 specifier set on the torch under test; empty = every torch
    model: "Model | None" = None  # the bug as a behaviour (`models`); facts and patterns only scope it
    # Set on the entry `find` returns for a model: what the models of the impl predict for the case
    # (outcomes, oracles and message above are that prediction) and the other entries it composes.
    prediction: "Prediction | None" = None
    also: tuple[str, ...] = ()
    ranks: int = 1  # the fewest ranks a run needs for the entry to apply (`--ranks N`; 1: any run)
    # True: its cells lie beyond the default matrices (a shape the fuzzer found), so matching none
    # of them is no sign of a dead entry
    beyond_matrix: bool = False
    source: str = ""  # the file the entry came from ('' for one made in code)

    @property
    def outcome(self) -> str:
        """The first (usually only) outcome expected."""
        return self.outcomes[0]

    @property
    def expects_pass(self) -> bool:
        """True for an entry that says its cases pass (``outcome = "pass"``)."""
        return self.outcomes == ("pass",)

    @property
    def label(self) -> str:
        """The bug's name, else 'entry N'."""
        return self.name or f"entry {self.number}"

    def expected(self) -> str:
        """'mismatch (recompute-mask, gradient)' or "error matching 'TypeError'": what it expects."""
        if self.model is not None and self.prediction is None:
            return f"what its model predicts ({self.model.describe()})"
        parts = []
        for outcome in self.outcomes:
            if outcome == "mismatch" and self.oracles:
                parts.append(f"{outcome} ({', '.join(self.oracles)})")
            elif outcome not in ("mismatch", "pass") and self.message:
                parts.append(f"{outcome} matching {self.message!r}")
            else:
                parts.append(outcome)
        return " or ".join(parts)

    def signature(self) -> tuple:
        """What the entry expects (two entries claiming one case with different ones conflict)."""
        if self.model is not None:
            return ("model", self.model)
        return (self.outcomes, self.oracles, self.message)

    def explains(self, outcome: str, oracles: Iterable[str], error: str) -> bool:
        """True when a failed case failed exactly the way this entry says."""
        if outcome not in self.outcomes:
            return False
        if outcome == "mismatch":
            return set(self.oracles) <= set(oracles)
        return not self.message or re.search(self.message, error or "") is not None

    def matches(self, impl: str, case: Any) -> bool:
        """Impl, facts and case-id patterns (the version is `applies_to`'s business); `case` is a
        `Case` or a case id."""
        return fnmatch.fnmatchcase(impl, self.impl) and self.matches_case(case)

    def matches_case(self, case: Any) -> bool:
        """Every fact holds for `case` and, where the entry has patterns, one matches its id."""
        return not self.misses(case)

    def misses(self, case: Any) -> list[str]:
        """Why `case` is not this entry's, one phrase each ([] when it is)."""
        found = _case(case)
        case_id = case if isinstance(case, str) else case.id
        out = []
        if self.patterns and not any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns):
            out.append(f"the id matches none of {', '.join(self.patterns)}")
        if self.facts or self.unless:
            if found is None:
                return [*out, "the id names no case"]
            out += missed(dict(self.facts), found)
            for facts in self.unless:
                if not missed(dict(facts), found):
                    out.append(f"unless {', '.join(f'{k}={_shown(v)}' for k, v in facts)} holds")
        return out

    def applies_to(self, version: "str | None", torch_version: "str | None" = None) -> bool:
        """True when the impl's `version` is in the entry's `versions` range and the torch under
        test (`torch_version`, default this process's torch) in its `torch` range; an absent
        range holds for every version."""
        return not self.outside(version, torch_version)

    def outside(self, version: "str | None", torch_version: "str | None" = None) -> list[str]:
        """Why the entry's version ranges exclude this run, one phrase each ([] when they hold)."""
        out = []
        if self.versions and not version_in(version, self.versions):
            out.append(f"version {version or 'unknown'} is outside {self.versions}")
        if self.torch:
            torch_version = torch_version or _torch_version()
            if not version_in(torch_version, self.torch):
                out.append(f"torch {torch_version} is outside {self.torch}")
        return out

    def describe(self) -> str:
        ranges = [f"{key} {spec}" for key, spec in (("versions", self.versions), ("torch", self.torch)) if spec]
        where = f" ({', '.join(ranges)})" if ranges else ""
        what = [*(f"{k}={_shown(v)}" for k, v in self.facts), *self.patterns,
                *([f"model {self.model.describe()}"] if self.model else [])]
        named = f" ({self.name})" if self.name else ""
        return f"{self.impl}{named}: {', '.join(what)}{where}"


def _torch_version() -> str:
    import torch

    return torch.__version__


def _shown(value: Any) -> str:
    if isinstance(value, frozenset):
        return "|".join(sorted(value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _string_list(raw: Any, key: str, where: str) -> tuple[str, ...]:
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ExpectationError(f"{where} {key} must be a string or a list of strings")
    return tuple(values)


def _range(raw: Mapping[str, Any], key: str, where: str) -> str:
    """A `versions` or `torch` range of an entry, checked ('' where absent)."""
    spec = raw.get(key, "")
    if not isinstance(spec, str):
        raise ExpectationError(f"{where} {key} must be a string such as \">=0.16,<0.20\", not {type(spec).__name__}")
    try:
        parse_versions(spec)
    except ExpectationError as exc:
        raise ExpectationError(f"{where}: {exc}") from None
    return spec.strip()


def _entry(raw: Mapping[str, Any], where: str, number: int = 0) -> Expectation:
    """One [[expect]] table -> `Expectation`; anything malformed is one ExpectationError line."""
    missing = [key for key in ("impl", "reason") if key not in raw]
    if missing:
        raise ExpectationError(f"{where} lacks {', '.join(missing)}")
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise ExpectationError(f"{where} has unknown key {unknown[0]!r}; keys: {', '.join(sorted(ENTRY_KEYS))}")
    facts = check_facts(raw, where, ExpectationError)
    model = None
    if "model" in raw:
        try:
            model = parse_model(raw["model"], where)
        except ModelError as exc:
            raise ExpectationError(str(exc)) from None
        said = [key for key in MODEL_DECIDES if key in raw]
        if said:
            raise ExpectationError(f"{where} has a model and {said[0]}: its model says which failure a case shows")
    elif "cases" not in raw and not facts:
        raise ExpectationError(f"{where} names no cases: give facts ({', '.join(FACT_KEYS)}), cases patterns "
                               "or a model")
    versions, torch_range = (_range(raw, key, where) for key in ("versions", "torch"))
    outcomes = _string_list(raw.get("outcome", "mismatch"), "outcome", where)
    bad_outcome = [o for o in outcomes if o not in OUTCOMES]
    if bad_outcome:
        raise ExpectationError(f"{where} outcome {bad_outcome[0]!r} is not one of {', '.join(OUTCOMES)}")
    if "pass" in outcomes and len(outcomes) > 1:
        raise ExpectationError(f"{where} outcome 'pass' cannot stand beside failures")
    oracles = _string_list(raw["oracles"], "oracles", where) if "oracles" in raw else ()
    bad = [o for o in oracles if o not in ORACLES]
    if bad:
        raise ExpectationError(f"{where} names unknown oracle {bad[0]!r}; oracles: {', '.join(ORACLES)}")
    if oracles and "mismatch" not in outcomes:
        raise ExpectationError(f"{where} names oracles, which only a mismatch has (outcome is {outcomes[0]!r})")
    message = raw.get("message", "")
    if not isinstance(message, str):
        raise ExpectationError(f"{where} message must be a string (a regular expression)")
    if message and outcomes == ("mismatch",):
        raise ExpectationError(f"{where} has a message, which a mismatch has not (use oracles)")
    if message and outcomes == ("pass",):
        raise ExpectationError(f"{where} has a message, which a pass entry has not")
    try:
        re.compile(message)
    except re.error as exc:
        raise ExpectationError(f"{where} message {message!r} is not a regular expression: {exc}") from None
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise ExpectationError(f"{where} name must be a string")
    ranks = raw.get("ranks", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ExpectationError(f"{where} ranks must be a positive integer (the fewest ranks a run needs), "
                               f"not {ranks!r}")
    beyond_matrix = raw.get("beyond_matrix", False)
    if not isinstance(beyond_matrix, bool):
        raise ExpectationError(f"{where} beyond_matrix must be true or false")
    patterns = _string_list(raw["cases"], "cases", where) if "cases" in raw else ()
    unless_raw = raw.get("unless", [])
    unless_raw = unless_raw if isinstance(unless_raw, list) else [unless_raw]
    unless = []
    for table in unless_raw:
        if not isinstance(table, Mapping) or not table or set(table) - set(FACT_KEYS):
            raise ExpectationError(f"{where} unless must be a table of facts ({', '.join(FACT_KEYS)}) "
                                   "or a list of them")
        unless.append(tuple(check_facts(table, f"{where} unless", ExpectationError).items()))
    return Expectation(
        raw["impl"], patterns, raw["reason"], raw.get("issue", ""), versions, outcomes, oracles, message,
        tuple(facts.items()), tuple(unless), name, number, torch_range, model, ranks=ranks,
        beyond_matrix=beyond_matrix,
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
    return [dataclasses.replace(entry, source=str(path)) for n, raw in enumerate(data.get("expect", []), start=1)
            for entry in _entries(raw, f"{path}: entry {n}", n)]


def load_all(path: "str | Path | None" = None, added: Iterable["str | Path"] = (),
             known_impls: Iterable[str] = ()) -> list[Expectation]:
    """The entries a run judges by, in the order `find` asks them: `path`'s (default the shipped
    file), then each file an installed package registers (entry-point group
    ``harness.expectations``), then the `added` files (``--add-expectations``), each in turn.

    A package's file may name only the impls that package registers (``harness.implementations``):
    a third party adds the known bugs of its own checkpoint, never verdicts on another's.  Every
    fault (a file that cannot be read, an entry point that does not load, an entry for another
    package's impl) is an `ExpectationError`, one line.  `known_impls`: every registered name,
    for the package check (an entry's ``impl`` may be a pattern)."""
    from .. import entry_points

    entries = load(path)
    known = list(known_impls)
    for registration in entry_points.expectation_sources():
        try:
            file = entry_points.expectations_path(registration)
        except entry_points.EntryPointError as exc:
            raise ExpectationError(str(exc)) from None
        own = entry_points.impls_of(registration.package)
        theirs = load(file)
        for entry in theirs:
            named = {name for name in known if fnmatch.fnmatchcase(name, entry.impl)}
            if named - own:
                raise ExpectationError(
                    f"expectations file {file} of {registration.origin}: entry {entry.number} names impl "
                    f"{entry.impl!r} ({', '.join(sorted(named - own))}), which {registration.package} does not "
                    f"register; a package's entries are for its own impls ({', '.join(sorted(own)) or 'none'})")
        entries += theirs
    for file in added:
        entries += load(file)
    return entries


def _entries(raw: Any, where: str, number: int = 0) -> list[Expectation]:
    """One [[expect]] table -> its entries: one per impl where ``impl`` is a list of names."""
    if not isinstance(raw, Mapping):
        raise ExpectationError(f"{where} is not a table")
    impl = raw.get("impl")
    if isinstance(impl, list):
        names = _string_list(impl, "impl", where)
        return [_entry({**raw, "impl": name}, where, number) for name in names]
    return [_entry(raw, where, number)]


def find(
    entries: Iterable[Expectation], impl: str, case: Any, version: "str | None" = None,
    torch_version: "str | None" = None, machine: "Machine | None" = None, ranks: int = 1,
) -> Expectation | None:
    """The first entry expecting `impl` (at `version`) to fail `case` (a `Case` or a case id),
    or None.

    `version` is the impl's version (`adapter.version`); entries with a `versions` range match
    only when it is known and in range, entries without one match whatever it is.
    `torch_version`: the torch the case ran on, for `torch` ranges (default this process's).

    A model entry claims the case where the models of every entry of the impl that applies to
    it, composed (`models.predict`), predict a failure: the entry returned is the one whose
    behaviour decides it, carrying that prediction as its expected failure.  Where they predict
    a pass the entries after them are still asked.  `machine`: what the installed torch does,
    for the models (default: asked here).  `ranks`: how many ranks the run had (an entry with
    ``ranks = N`` applies only to runs of N ranks or more).
    """
    entries = [entry for entry in entries if entry.ranks <= ranks]
    models_asked = False
    for entry in entries:
        if not (entry.matches(impl, case) and entry.applies_to(version, torch_version)):
            continue
        if entry.model is None:
            return entry
        if not models_asked:
            models_asked = True
            found = predicted(entries, impl, case, version, torch_version, machine)
            if found is not None:
                return found
    return None


def model_entries(entries: Iterable[Expectation], impl: str, case: Any, version: "str | None" = None,
                  torch_version: "str | None" = None) -> list[Expectation]:
    """The model entries of `impl` that apply to `case` (scope and versions), in file order."""
    return [e for e in entries if e.model is not None and e.matches(impl, case)
            and e.applies_to(version, torch_version)]


def predicted(entries: Iterable[Expectation], impl: str, case: Any, version: "str | None" = None,
              torch_version: "str | None" = None, machine: "Machine | None" = None) -> Expectation | None:
    """The composed prediction of `impl`'s model entries for `case`, as the deciding entry with
    the predicted failure (None where they predict a pass, or none applies)."""
    found = _case(case)
    applying = model_entries(entries, impl, case, version, torch_version)
    if found is None or not applying:
        return None
    prediction = predict([e.model for e in applying], found, machine or LOCAL)  # type: ignore[misc]
    if prediction.outcome == "pass":
        return None
    first = applying[prediction.causes[0]] if prediction.causes else applying[0]
    return dataclasses.replace(
        first, outcomes=(prediction.outcome,), oracles=prediction.oracles, message=prediction.message,
        prediction=prediction, also=tuple(applying[i].label for i in prediction.causes[1:]))


def explain(entries: Iterable[Expectation], impl: str, case: Any, version: "str | None" = None,
            torch_version: "str | None" = None, machine: "Machine | None" = None) -> list[str]:
    """Which entry of `impl` claims `case` and why each other one does not, one line per entry
    of that impl, in file order ('matches' first-wins, 'also matches', or what it misses).
    `torch_version` and `machine` as for `find`."""
    lines, chosen = [], None
    found = _case(case)
    for entry in entries:
        if not fnmatch.fnmatchcase(impl, entry.impl):
            continue
        misses = entry.misses(case) or entry.outside(version, torch_version)
        if misses:
            lines.append(f"  no    {entry.label}: {'; '.join(misses)}")
        elif entry.model is not None:
            alone = predict([entry.model], found, machine or LOCAL) if found is not None else None
            said = ("predicts a pass: its bug cannot show here" if alone is None or alone.outcome == "pass"
                    else f"predicts {_predicted(alone)}" + (f": {alone.why[0]}" if alone.why else ""))
            lines.append(f"  model {entry.label}: {entry.model.describe()} {said}")
        elif chosen is None:
            chosen = entry
            lines.append(f"  MATCH {entry.label}: expects {entry.expected()}: {entry.reason.splitlines()[0]}")
        else:
            also = "the same failure" if entry.signature() == chosen.signature() else f"{entry.expected()} (conflict)"
            lines.append(f"  also  {entry.label}: expects {also}")
    return lines


def _predicted(prediction: Prediction) -> str:
    if prediction.outcome == "mismatch":
        return f"mismatch ({', '.join(prediction.oracles)})"
    return f"{prediction.outcome} matching {prediction.message!r}"


def unmatched(entries: Iterable[Expectation], cases: Iterable[Any]) -> list[Expectation]:
    """Entries that match none of `cases` (Cases or ids; dead entries to warn about), except those
    whose cells lie beyond the default matrices (``beyond_matrix = true``)."""
    found = list(cases)
    return [e for e in entries if not e.beyond_matrix and not any(e.matches_case(case) for case in found)]


def conflicts(entries: Iterable[Expectation], cases: Iterable[Any]) -> list[str]:
    """One line per case that two entries of one impl (and the same version ranges) both claim with
    different expected failures: the first would win without a word.  Model entries compose
    instead of conflicting (`models.predict`), so they are left out."""
    by_impl: dict[tuple[str, str], list[Expectation]] = {}
    for entry in entries:
        if entry.model is not None:
            continue
        by_impl.setdefault((entry.impl, entry.versions, entry.torch), []).append(entry)
    lines = []
    for (impl, _, _), group in by_impl.items():
        if len(group) < 2:
            continue
        seen: set[tuple[int, int]] = set()
        for case in cases:
            claiming = [e for e in group if e.matches_case(case)]
            for later in claiming[1:]:
                first = claiming[0]
                pair = (first.number, later.number)
                if later.signature() != first.signature() and pair not in seen:
                    seen.add(pair)
                    case_id = case if isinstance(case, str) else case.id
                    lines.append(f"conflict: {impl}: {first.label} ({first.expected()}) and {later.label} "
                                 f"({later.expected()}) both claim {case_id}")
    return lines


def unknown_impl(entries: Iterable[Expectation], known_impls: Iterable[str]) -> list[Expectation]:
    """Entries whose impl (a name or an fnmatch pattern) matches none of `known_impls`: they can
    never apply (an import path ``pkg.mod:factory`` counts as known)."""
    known = set(known_impls)
    return [e for e in entries if ":" not in e.impl and not any(fnmatch.fnmatchcase(k, e.impl) for k in known)]


def check_impls(entries: Iterable[Expectation], known_impls: Iterable[str], path: "str | Path | None" = None) -> None:
    """Raise ExpectationError, one line, when an entry names an impl no implementation matches: an
    entry that can never apply is a typo the run would otherwise pass over in silence."""
    unknown = unknown_impl(entries, known_impls)
    if unknown:
        first = unknown[0]
        more = f" (and {len(unknown) - 1} more entries)" if len(unknown) > 1 else ""
        entry = f"entry {first.number}" + (f" ({first.name})" if first.name else "")
        raise ExpectationError(f"expectations file {first.source or path or DEFAULT_PATH}: {entry} names impl "
                               f"{first.impl!r}, "
                               f"which matches no known implementation{more}; the names: python -m harness list "
                               "--impls (an import path pkg.mod:factory also counts)")


def entry_problems(entries: Iterable[Expectation], known_impls: Iterable[str],
                   case_ids: Iterable[Any] | None = None) -> list[str]:
    """One line per entry that can never apply, or applies where another entry does too: its impl
    names no known implementation (a registered name; an import path ``pkg.mod:factory`` counts
    as known), its cases match no case of the whole matrix, or it claims a case another entry
    of its impl claims with another expected failure (`conflicts`).  `known_impls`: the
    registered names (`impls.registered()`); `case_ids` default: every generated case (default
    matrices, CPU and CUDA)."""
    cases = list(generate()) if case_ids is None else list(case_ids)
    entries = list(entries)
    lines = [f"impl matches no known implementation: {e.describe()}" for e in unknown_impl(entries, known_impls)]
    lines += [f"cases match no case: {e.describe()}" for e in unmatched(entries, cases)]
    lines += conflicts(entries, cases)
    return lines


@dataclass(frozen=True)
class Judgement:
    """How one result counts: its verdict and, where it is not self-evident, why."""

    verdict: str  # pass | fail | xfail | stale | skip
    note: str = ""


def judge(outcome: str, oracles: Iterable[str], error: str, entry: Expectation | None, *,
          impl: str, must_support_all: bool = False, reason: str = "", rounding_fails: bool = False) -> Judgement:
    """The verdict of a result (`outcome`, failing `oracles`, `error` text) under its entry.

    Without an entry: pass -> pass, a failure -> fail, unsupported / skipped -> skip, except that
    an impl that must support every valid case (`must_support_all`) fails an unsupported one.
    With an entry: the failure it names -> xfail; any other failure -> fail ("wrong failure");
    a pass -> stale.  A ``rounding`` outcome (module mode: no random number differs, some
    gradient or output by rounding only) passes, or fails where `rounding_fails`.
    """
    fired = list(dict.fromkeys(oracles))
    if outcome == "rounding":
        note = ("no random number differs; gradients or outputs differ by rounding only (the same terms added in "
                "another order)")
        return Judgement("fail", note) if rounding_fails else Judgement("pass", note)
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
