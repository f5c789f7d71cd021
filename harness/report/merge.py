"""Merging reports of separate jobs, and comparing two reports.

A case is identified by impl, case id and the environment it ran in (GPU and host, see
`env.env_key`): merging the shards of one job joins their cases, and merging an A100 job
with an H100 job keeps the same case twice, once per GPU.  Comparing lists what changed between a
base report and a new one; a new failure (or a regression: a case that passed and now does not
run) is what CI gates on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..results import FAILED_OUTCOMES, SKIPPED_OUTCOMES
from .env import env_key
from .frame import (
    mismatches,
    record_key,
    record_verdict,
    repro_command,
    text,
)

UNKNOWN_ENV = {"gpu": "unknown", "host": "unknown"}
MAX_LISTED = 20  # conflicts and one-sided cases listed by name; the rest are counted


def _signature(record: Mapping[str, Any]) -> tuple:
    """What makes two results of one case the same result (not when or where in a pool it ran)."""
    found = tuple((m.oracle, m.subject, m.iteration, m.count) for m in mismatches(record))
    return (record.get("outcome"), record_verdict(record), record.get("error", ""), found)


def merge(sources: Sequence[tuple[str, list[dict[str, Any]]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Join the records of several reports: ([records], [notes]).

    Records keep their own environment (a record without one gets `UNKNOWN_ENV`).  The same case
    (impl, case id, environment) seen twice with the same result is kept once; seen with different
    results (a rerun), the later source wins and a note names both.
    """
    merged: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
    notes: list[str] = []
    duplicates = 0
    conflicts: list[str] = []
    for source, records in sources:
        for record in records:
            record = dict(record)
            if not record.get("env"):
                record["env"] = dict(UNKNOWN_ENV)
            key = record_key(record)
            if key in merged:
                earlier_source, earlier = merged[key]
                if _signature(earlier) == _signature(record):
                    duplicates += 1
                    continue
                conflicts.append(f"{key[0]} {key[1]} on {key[2]}: {_describe(earlier)} in {earlier_source}, "
                                 f"{_describe(record)} in {source}; kept {source}")
            merged[key] = (source, record)
    if duplicates:
        notes.append(f"{duplicates} case{'s' * (duplicates != 1)} appeared in more than one input with the "
                     "same result; kept once")
    if conflicts:
        notes.append(f"{len(conflicts)} case{'s' * (len(conflicts) != 1)} had different results in different "
                     "inputs; the later input wins:")
        notes += [f"  {line}" for line in conflicts[:MAX_LISTED]]
        if len(conflicts) > MAX_LISTED:
            notes.append(f"  ... and {len(conflicts) - MAX_LISTED} more")
    return [record for _, record in merged.values()], notes


def _failing(record: Mapping[str, Any] | None) -> bool:
    return record is not None and record.get("outcome") in FAILED_OUTCOMES


def _newly_failing(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """A failure now that was none before: the outcome turned into a failure, or the verdict
    turned into fail (e.g. a known failure that now fails another way, same outcome)."""
    if _failing(after) and not _failing(before):
        return True
    return record_verdict(after) == "fail" and record_verdict(before) != "fail"


def _regressed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Passed before, and now is not even run: unsupported or skipped."""
    return before.get("outcome") == "pass" and after.get("outcome") in SKIPPED_OUTCOMES


def _envs(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for record in records:
        out.setdefault(env_key(record.get("env")), record.get("env") or {})
    return out


def match_environments(base: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
                       ) -> dict[str, str]:
    """New environment key -> base environment key.  Equal keys match; otherwise the same GPU on
    another host (CI runners change names); otherwise, with one environment left on each side, those two."""
    mapping = {key: key for key in new if key in base}
    rest_base = [key for key in base if key not in mapping.values()]
    rest_new = [key for key in new if key not in mapping]
    for key in list(rest_new):
        gpu = new[key].get("gpu")
        same_base = [b for b in rest_base if base[b].get("gpu") == gpu]
        same_new = [n for n in rest_new if new[n].get("gpu") == gpu]
        if len(same_base) == 1 and len(same_new) == 1:
            mapping[key] = same_base[0]
            rest_base.remove(same_base[0])
            rest_new.remove(key)
    if len(rest_new) == 1 and len(rest_base) == 1:
        mapping[rest_new[0]] = rest_base[0]
    return mapping


@dataclass
class Change:
    """One case whose result differs between the base and the new report."""

    impl: str
    case_id: str
    env: str
    base: Mapping[str, Any] | None
    new: Mapping[str, Any] | None

    def line(self) -> str:
        before = _describe(self.base)
        after = _describe(self.new)
        out = f"{self.impl} {self.case_id} [{self.env}]: {before} -> {after}"
        if self.new is None:
            return out
        note = text(self.new, "verdict_note").strip()
        if note:
            out += f"\n    {note.splitlines()[0]}"
        if _failing(self.new) or record_verdict(self.new) == "fail" or (
                self.base is not None and _regressed(self.base, self.new)):
            found = mismatches(self.new)
            first = (found[0].message() if found else _first_line(self.new.get("error"))
                     or _first_line(self.new.get("reason")))
            if first and first != note:
                out += f"\n    {first}"
            out += f"\n    rerun: {repro_command(self.new)}"
        return out


def _first_line(value: Any) -> str:
    lines = [line for line in str(value or "").splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _describe(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "absent"
    verdict_name = record_verdict(record)
    outcome = str(record.get("outcome", "?"))
    plain = verdict_name in ("pass", "skip") or (verdict_name == "fail" and outcome in FAILED_OUTCOMES)
    return outcome if plain else f"{outcome} ({verdict_name})"


@dataclass
class Comparison:
    """What changed from `base` to `new`: new failures, regressions (passed, now unsupported or
    skipped), fixed cases, other changed results, and cases present on one side only."""

    base_count: int
    new_count: int
    new_failures: list[Change] = field(default_factory=list)
    regressions: list[Change] = field(default_factory=list)
    fixed: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    only_base: list[Change] = field(default_factory=list)
    only_new: list[Change] = field(default_factory=list)
    env_notes: list[str] = field(default_factory=list)

    allow_missing: bool = False  # the selection changed on purpose: cases only in base are not regressions

    @property
    def failed(self) -> bool:
        """Whether CI should fail: a new failure, a regression, or (unless `allow_missing`) a case of
        the base that the new run did not run at all (a case that did not run is never fine)."""
        return bool(self.new_failures or self.regressions or (self.only_base and not self.allow_missing))

    def lines(self, base_name: str, new_name: str) -> list[str]:
        """The comparison as text for a terminal or a CI log."""
        out = [f"compare {base_name} ({self.base_count} cases) -> {new_name} ({self.new_count} cases)"]
        out += self.env_notes
        for title, items, limit in (("New failures", self.new_failures, None),
                                    ("Regressions (passed in base, unsupported or skipped in new)",
                                     self.regressions, None),
                                    ("Fixed", self.fixed, None),
                                    ("Changed results", self.changed, None),
                                    ("Only in base (not run in new: a regression unless --allow-missing)"
                                     if not self.allow_missing else "Only in base (not run in new; allowed)",
                                     self.only_base, MAX_LISTED),
                                    ("Only in new (not run in base)", self.only_new, MAX_LISTED)):
            out.append(f"{title}: {len(items)}")
            shown = items if limit is None else items[:limit]
            out += [f"  {change.line()}" for change in shown]
            if len(items) > len(shown):
                out.append(f"  ... and {len(items) - len(shown)} more")
        return out


def compare(base: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], *,
            allow_missing: bool = False) -> Comparison:
    """Compare two reports case by case (impl, case id, matched environment).

    A new failure is a case that fails (mismatch, error, crash, timeout) in `new` and did not fail
    in `base`, whose verdict became fail (e.g. a known failure that now fails another way, with
    the same outcome), or that is new in `new` and fails unexpectedly.  A regression passed in
    `base` and is unsupported or skipped in `new`.  Fixed: failed in `base`, passes in `new`.
    Changed: any other difference of outcome or verdict, or a failure whose failing oracles moved.
    A case of `base` absent from `new` fails the comparison unless `allow_missing`.
    """
    base_envs, new_envs = _envs(base), _envs(new)
    mapping = match_environments(base_envs, new_envs)
    result = Comparison(len(base), len(new), allow_missing=allow_missing)
    for new_key, base_key in mapping.items():
        if new_key != base_key:
            result.env_notes.append(f"environment {new_key} (new) compared with {base_key} (base)")
    base_index = {record_key(r): r for r in base}
    seen: set[tuple[str, str, str]] = set()
    for record in sorted(new, key=record_key):
        impl, case_id, key = record_key(record)
        base_key = (impl, case_id, mapping.get(key, f"\0{key}"))
        before = base_index.get(base_key)
        seen.add(base_key)
        change = Change(impl, case_id, key, before, record)
        if before is None:
            (result.new_failures if record_verdict(record) == "fail" else result.only_new).append(change)
        elif _newly_failing(before, record):
            result.new_failures.append(change)
        elif _regressed(before, record):
            result.regressions.append(change)
        elif (_failing(before) or record_verdict(before) == "fail") and record.get("outcome") == "pass":
            result.fixed.append(change)
        elif _signature(before)[:2] != _signature(record)[:2] or _oracles(before) != _oracles(record):
            result.changed.append(change)
    for record in sorted(base, key=record_key):
        if record_key(record) not in seen:
            impl, case_id, key = record_key(record)
            result.only_base.append(Change(impl, case_id, key, record, None))
    return result


def _oracles(record: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(m.oracle, m.subject) for m in mismatches(record)}
