"""The model of one run: everything a report view shows, decided once from the records.

`build` reads the records (plus the expectation-problem lines and an interrupted note) and
computes the totals, the counts per impl (and environment), what needs attention, the failing
cases grouped by verdict and the layout x capture matrices.  summary.md, report.html and the
GitHub step summary only render a `RunModel`: what "needs attention" means is decided here and
nowhere else.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..results import FAILED_OUTCOMES, OUTCOMES, RNG_APIS, SKIPPED_OUTCOMES
from .env import env_key, rng_apis
from .frame import (
    LISTED_VERDICTS,
    SEVERITY,
    STATUSES,
    case_sort_key,
    environments,
    labels_of,
    mismatches,
    ordered,
    record_verdict,
    status,
    text,
    text_list,
)

TRACEBACK_LINES = 15  # the tail of a traceback shown with an error or crash
ENV_FIELDS = ("harness", "host", "gpu", "compute_capability", "driver", "driver (CUDA API)", "torch", "cuda", "python")
_HIDDEN_ENV_FIELDS = {"rng_apis", "gpu_name", "gpu_count"}
NO_REASON = "no reason given"


@dataclass(frozen=True)
class Total:
    """One part of the totals line; `loud` parts are what a reader must not miss."""

    text: str
    loud: bool = False


@dataclass(frozen=True)
class CaseNote:
    """A case named in a report, with the one line said about it."""

    record: Mapping[str, Any]
    env: str  # the label of its environment; "" when the run has one environment
    note: str


@dataclass(frozen=True)
class SkipGroup:
    """The unsupported (or skipped) cases of one impl in one environment, with their reasons."""

    impl: str
    env: str  # "" when the run has one environment
    outcome: str  # unsupported | skipped
    reasons: tuple[tuple[str, int], ...]  # (reason, cases), most cases first

    @property
    def count(self) -> int:
        return sum(n for _, n in self.reasons)

    def line(self) -> str:
        """'megatron: 60 unsupported — ImportError: No module named 'megatron' (60)'."""
        where = f" on {self.env}" if self.env else ""
        reasons = "; ".join(f"{reason} ({n})" for reason, n in self.reasons)
        return f"{self.impl}{where}: {self.count} {self.outcome} — {reasons}"


@dataclass(frozen=True)
class Attention:
    """What needs attention, in the order it is shown: the interrupted note, unexpected failures,
    stale expectations, expectation problems, then unsupported and skipped cases per impl."""

    interrupted: str = ""
    failures: tuple[CaseNote, ...] = ()
    stale: tuple[CaseNote, ...] = ()
    problems: tuple[str, ...] = ()
    skips: tuple[SkipGroup, ...] = ()

    @property
    def nothing(self) -> bool:
        """True only when there is nothing at all to say."""
        return not (self.interrupted or self.failures or self.stale or self.problems or self.skips)


@dataclass(frozen=True)
class Square:
    """One case in a matrix cell (or a hole where no such case exists: `record` None)."""

    record: Mapping[str, Any] | None
    status: str  # "" for a hole
    linked: bool  # its details are listed under "Failing cases"
    tip: str
    failed: bool = False  # verdict fail though its status is no failure (e.g. unsupported where support is required)


@dataclass(frozen=True)
class Cell:
    """One layout x capture of a matrix: a square per nesting x interleave (nesting-major)."""

    squares: tuple[Square, ...]

    @property
    def statuses(self) -> list[str]:
        return [s.status for s in self.squares if s.record is not None]

    @property
    def worst(self) -> str:
        """The status that colours the cell: the most severe one present."""
        present = self.statuses
        return next((s for s in SEVERITY if s in present), "empty")

    def text(self) -> str:
        """'pass 4 · xfail 2 /6'."""
        return cell_text(self.statuses)


@dataclass(frozen=True)
class Matrix:
    """Layout x capture for one impl and mode (and environment)."""

    impl: str
    mode: str
    env: str  # "" when the run has one environment
    layouts: tuple[str, ...]
    captures: tuple[str, ...]
    nestings: tuple[str, ...]
    interleaves: tuple[str, ...]
    cells: Mapping[tuple[str, str], Cell]

    def title(self) -> str:
        return " · ".join(p for p in (self.impl, self.mode, self.env) if p)


@dataclass
class RunModel:
    """A run as its report shows it, computed once by `build`."""

    records: list[dict[str, Any]]
    interrupted: str
    labels: dict[str, str]  # environment key -> label
    environments: dict[str, dict[str, Any]]  # label -> environment
    env_fields: tuple[str, ...]
    api_names: tuple[str, ...]
    apis: dict[str, dict[str, str]]  # label -> RNG API -> yes / no / unknown (...)
    totals: tuple[Total, ...]
    counts: Any  # DataFrame: per impl (and environment): outcomes, total, verdicts
    impl_statuses: dict[str, dict[str, int]]  # impl -> status -> cases
    attention: Attention
    failing: dict[str, tuple[CaseNote, ...]]  # fail / stale / xfail -> cases, in this order
    matrices: tuple[Matrix, ...]
    nestings: tuple[str, ...] = field(default=())  # over the whole run, for legends
    interleaves: tuple[str, ...] = field(default=())

    @property
    def multi_env(self) -> bool:
        return len(self.environments) > 1

    def env_of(self, record: Mapping[str, Any]) -> str:
        """The label of the environment `record` ran in; "" when the run has one environment."""
        return self.labels[env_key(record.get("env"))] if self.multi_env else ""

    def failing_cases(self) -> list[CaseNote]:
        """Every listed case: unexpected failures, stale, then known failures."""
        return [case for name in LISTED_VERDICTS for case in self.failing.get(name, ())]


def build(records: Sequence[Mapping[str, Any]], *, problems: Iterable[str] | None = None,
          interrupted: str | None = None) -> RunModel:
    """The model of `records` (in the order given): `problems` are the expectation-problem lines
    (entries matching no case or no implementation), `interrupted` a note such as "interrupted
    after 12 of 60 cases"; without one, the records' own `interrupted` fields are used."""
    records = [dict(r) for r in records]
    labels = labels_of(records)
    multi_env = len(labels) > 1
    envs = environments(records)
    note = interrupted or "; ".join(dict.fromkeys(text(r, "interrupted") for r in records if text(r, "interrupted")))

    def env_of(record: Mapping[str, Any]) -> str:
        return labels[env_key(record.get("env"))] if multi_env else ""

    listed: dict[str, tuple[CaseNote, ...]] = {}
    for name in LISTED_VERDICTS:
        subset = sorted((r for r in records if record_verdict(r) == name), key=case_sort_key)
        listed[name] = tuple(CaseNote(r, env_of(r), case_note(r)) for r in subset)
    attention = Attention(note, listed["fail"], listed["stale"], tuple(problems or ()),
                          skip_groups(records, env_of))
    env_fields = [f for f in ENV_FIELDS if any(f in env for env in envs.values())]
    env_fields += sorted({k for env in envs.values() for k in env} - set(ENV_FIELDS) - _HIDDEN_ENV_FIELDS)
    apis = {label: rng_apis(env) for label, env in envs.items()}
    api_names = list(RNG_APIS) + sorted({n for a in apis.values() for n in a} - set(RNG_APIS))
    impl_statuses: dict[str, dict[str, int]] = {}
    for impl in sorted({str(r["impl"]) for r in records}):
        found = Counter(status(r) for r in records if str(r["impl"]) == impl)
        impl_statuses[impl] = {s: found[s] for s in [*STATUSES, *sorted(set(found) - set(STATUSES))] if found[s]}
    return RunModel(
        records=records, interrupted=note, labels=labels, environments=envs,
        env_fields=tuple(env_fields), api_names=tuple(api_names), apis=apis,
        totals=totals(records), counts=counts_frame(records, env_of, multi_env),
        impl_statuses=impl_statuses, attention=attention, failing=listed,
        matrices=tuple(_matrices(records, labels, env_of)),
        nestings=tuple(ordered((r.get("nesting", "") for r in records), "nesting")),
        interleaves=tuple(ordered((r.get("interleave", "") for r in records), "interleave")),
    )


def first_line(value: Any) -> str:
    """The first non-blank line of a text, "" when there is none."""
    lines = [line for line in str(value or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def what_failed(record: Mapping[str, Any]) -> str:
    """The first mismatch line (with how many more), else the error's or the reason's first line."""
    found = mismatches(record)
    if found:
        return found[0].message() + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
    return first_line(record.get("error")) or first_line(record.get("reason"))


def case_note(record: Mapping[str, Any]) -> str:
    """The one line said about a listed case: its `verdict_note` when it has one; else, for a
    module run, its first divergent draw or its diagnosis; else, for a stale case, what it was
    expected to do, and for a failure, `what_failed`."""
    if text(record, "verdict_note"):
        return first_line(record["verdict_note"])
    if text(record, "first_divergent_draw"):  # a module run: the draw to look at first
        return f"first divergent draw: {first_line(record['first_divergent_draw'])}"
    if text(record, "diagnosis"):
        return first_line(record["diagnosis"])
    if record_verdict(record) == "stale":
        return f"expected to fail ({expectation_text(record)}) but passed"
    return what_failed(record)


def verdict_line(record: Mapping[str, Any]) -> str:
    """'fail — wrong failure: expected ..., got ...': the verdict with its note ("" without a
    note); a note that starts by naming the verdict ("stale: ...") does not name it twice."""
    note = text(record, "verdict_note").strip()
    if not note:
        return ""
    name = record_verdict(record)
    if note.lower().startswith(f"{name}: "):
        note = note[len(name) + 2:]
    return f"{name} — {note}"


def expectation_text(record: Mapping[str, Any], full: bool = False) -> str:
    """What the case was expected to do and why: 'mismatch (recompute-mask, gradient): <reason>'
    (the reason's first line unless `full`); "" for a case with no expectation."""
    reason = text(record, "expected_failure").strip() if full else first_line(record.get("expected_failure"))
    kind = text(record, "expected_outcome")
    oracles = text_list(record, "expected_oracles")
    if oracles:
        kind = f"{kind or 'mismatch'} ({', '.join(oracles)})"
    if kind and reason:
        return f"{kind}: {reason}"
    return kind or reason


def traceback_tail(record: Mapping[str, Any], limit: int = TRACEBACK_LINES) -> tuple[str, int]:
    """The last `limit` lines of the record's traceback, and how many lines it has (0: none)."""
    lines = text(record, "traceback").rstrip().splitlines()
    return "\n".join(lines[-limit:]), len(lines)


def skip_groups(records: Sequence[Mapping[str, Any]], env_of: Any = lambda r: "") -> tuple[SkipGroup, ...]:
    """Unsupported and skipped cases per impl (and environment), their reasons counted.  Every
    such case counts here, also one whose verdict is fail (it is listed as a failure too)."""
    groups: dict[tuple[str, str, str], Counter[str]] = {}
    for r in records:
        outcome = str(r.get("outcome", ""))
        if outcome in SKIPPED_OUTCOMES:
            reason = first_line(r.get("reason")) or first_line(r.get("error")) or NO_REASON
            groups.setdefault((str(r["impl"]), env_of(r), outcome), Counter())[reason] += 1
    order = {o: i for i, o in enumerate(SKIPPED_OUTCOMES)}
    envs = list(dict.fromkeys(env_of(r) for r in records))
    out = []
    for impl, env, outcome in sorted(groups, key=lambda k: (k[0], envs.index(k[1]), order[k[2]])):
        reasons = sorted(groups[impl, env, outcome].items(), key=lambda item: (-item[1], item[0]))
        out.append(SkipGroup(impl, env, outcome, tuple(reasons)))
    return tuple(out)


def totals(records: Sequence[Mapping[str, Any]]) -> tuple[Total, ...]:
    """'1260 cases · 7 impls · 1 environment · 520 pass · 64 unexpected fail · 676 xfail'."""
    verdicts = [record_verdict(r) for r in records]
    impls = {r["impl"] for r in records}
    envs = {env_key(r.get("env")) for r in records}
    parts = [Total(f"{len(records)} cases", True), Total(f"{len(impls)} impl{'s' * (len(impls) != 1)}"),
             Total(f"{len(envs)} environment{'s' * (len(envs) != 1)}")]
    names = {"pass": "pass", "fail": "unexpected fail", "xfail": "known failures (xfail)",
             "stale": "stale", "skip": "unsupported or skipped"}
    for name, label in names.items():
        count = verdicts.count(name)
        if count:
            parts.append(Total(f"{count} {label}", name in ("fail", "stale")))
    return tuple(parts)


def counts_frame(records: Sequence[Mapping[str, Any]], env_of: Any = lambda r: "", by_env: bool = False) -> Any:
    """Cases per outcome, then per verdict (unexpected fail / known (xfail) / stale), per impl (and
    environment).  Outcome columns that are zero everywhere are left out, except pass, mismatch,
    error and total."""
    import pandas as pd

    keys = ["impl", "env"] if by_env else ["impl"]
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((str(r["impl"]), env_of(r)) if by_env else (str(r["impl"]),), []).append(r)
    rows = []
    for key in sorted(groups):
        group = groups[key]
        outcomes = Counter(str(r.get("outcome", "")) for r in group)
        verdicts = Counter(record_verdict(r) for r in group)
        row: dict[str, Any] = dict(zip(keys, key))
        row.update({outcome: outcomes[outcome] for outcome in OUTCOMES})
        row["total"] = len(group)
        row["unexpected fail"] = verdicts["fail"]
        row["known (xfail)"] = verdicts["xfail"]
        row["stale"] = verdicts["stale"]
        rows.append(row)
    out = pd.DataFrame(rows, columns=[*keys, *OUTCOMES, "total", "unexpected fail", "known (xfail)", "stale"])
    always = {"pass", "mismatch", "error", "total"}
    keep = [c for c in out.columns if c in keys or c in always or out[c].any()]
    return out[keep]


def cell_text(statuses: Iterable[str]) -> str:
    """'pass 4 · xfail 2 /6': how many cases of a matrix cell show each status."""
    values = list(statuses)
    parts = [f"{s} {values.count(s)}" for s in STATUSES if s in values]
    parts += [f"{s} {values.count(s)}" for s in sorted(set(values) - set(STATUSES))]
    return f"{' · '.join(parts)} /{len(values)}"


def _square(record: Mapping[str, Any] | None) -> Square:
    if record is None:
        return Square(None, "", False, "no such case")
    name = status(record)
    verdict_name = record_verdict(record)
    linked = verdict_name in LISTED_VERDICTS
    tip = f"{record['case_id']}: {name}"
    note = case_note(record) if linked else ""
    if note:
        tip += f" ({note})"
    return Square(record, name, linked, tip, failed=verdict_name == "fail" and name not in FAILED_OUTCOMES)


def _matrices(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], env_of: Any) -> list[Matrix]:
    """Per impl (sorted), environment (as first seen) and mode (in the enum's order)."""
    out = []
    for impl in sorted({str(r["impl"]) for r in records}):
        of_impl = [r for r in records if str(r["impl"]) == impl]
        for key in labels:
            in_env = [r for r in of_impl if env_key(r.get("env")) == key]
            for mode in ordered((r.get("mode", "") for r in in_env), "mode"):
                subset = [r for r in in_env if r.get("mode", "") == mode]
                out.append(_matrix(impl, mode, env_of(subset[0]), subset))
    return out


def _matrix(impl: str, mode: str, env: str, records: Sequence[Mapping[str, Any]]) -> Matrix:
    nestings = ordered((r.get("nesting", "") for r in records), "nesting")
    interleaves = ordered((r.get("interleave", "") for r in records), "interleave")
    by_cell: dict[tuple[str, str], dict[tuple[str, str], list[Mapping[str, Any]]]] = {}
    for r in records:
        by_cell.setdefault((str(r.get("layout", "")), str(r.get("capture", ""))), {}).setdefault(
            (str(r.get("nesting", "")), str(r.get("interleave", ""))), []).append(r)
    cells = {}
    for place, found in by_cell.items():
        # One column per program (grouped by nesting), its squares the interleave values top to
        # bottom: the grid flows by column, so a program's cases stay in one column.
        squares = []
        for n in nestings:
            programs = list(dict.fromkeys(str(r.get("program", "")) for i in interleaves
                                          for r in found.get((n, i), [])))
            for program in programs or [None]:
                for i in interleaves:
                    match = [r for r in found.get((n, i), [])
                             if program is not None and str(r.get("program", "")) == program]
                    squares.extend(_square(r) for r in (match or [None]))
        cells[place] = Cell(tuple(squares))
    return Matrix(impl, mode, env,
                  tuple(ordered((r.get("layout", "") for r in records), "layout")),
                  tuple(ordered((r.get("capture", "") for r in records), "capture")),
                  tuple(nestings), tuple(interleaves), cells)
