"""The expectations file against recorded results: which entry claims what rightly, what wrongly,
and which failures it misses (issue 40, item 2).

Nothing is rerun.  Every record of a matrix or fuzz run (results.jsonl, from any machine, merged or
not) is judged again under the expectations as they are now: its case is looked up for its impl, at
the impl version and on the torch it ran with (the record's `impl_version` and ``env.torch``), and
its recorded outcome, fired oracles and error are held against the entry that claims it.  Per entry:

- **right**: the entry claims the case and the case did what it says (the failure it names, or a
  pass for an entry that expects one);
- **stale**: the entry expects a failure and the case passed (it claims a cell where its bug
  cannot show);
- **wrong**: the entry claims the case and the case failed otherwise (another outcome, another
  oracle, another error), or failed where the entry expects a pass;
- **missed**: no entry claims the case, it failed, and this entry (of the same impl, applying to
  that version and torch) would explain exactly that failure: the bug it names, shown where its
  cases do not reach.  A model entry would where its model alone, outside the entry's scope,
  predicts this failure; an entry that is still a predicate, where it expects this failure (its
  outcome, its oracles among those that fired, its message).  Of several, the one naming the most
  oracles is charged, the first in the file among equals.

Models ask what the installed torch does (`models.Machine`): a record keeps the answers its run
was given (``machine_facts``); where it has none, this machine answers if it runs the torch the
record ran on, and otherwise the model does not know (a backend it cannot ask is no difference).

A failure no entry claims or would explain is **new**.  Unsupported and skipped cases, records that
are not matrix or fuzz cases (module mode), errors raised outside the impl (`OUTSIDE_IMPL`), a device
out of memory and fuzz failures a second run did not repeat (`NOT_REPEATED`) are counted apart and
judged for no entry.  A wrong claim (stale or wrong) fails the audit.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..model.cases import CaseError, parse_case_id
from ..results import NOT_REPEATED, OUTSIDE_IMPL, out_of_device_memory
from .expectations import Expectation, find, judge
from .models import LOCAL, Machine, predict

EXAMPLES = 3  # case ids shown per entry and kind


@dataclass
class EntryAudit:
    """What one entry (for one impl) claimed in the records, with a few case ids of each kind."""

    impl: str
    label: str
    number: int
    right: int = 0
    stale: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)

    @property
    def claimed(self) -> int:
        return self.right + len(self.stale) + len(self.wrong)


@dataclass
class Audit:
    """The audit of a set of records: per entry, and what no entry covers."""

    records: int = 0
    entries: dict[tuple[str, int, str], EntryAudit] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)  # "impl case_id: outcome" of failures nothing explains
    unclaimed_passes: int = 0
    not_judged: dict[str, int] = field(default_factory=dict)  # why -> count

    @property
    def wrong_claims(self) -> int:
        """Stale and wrong claims in all: what fails the audit."""
        return sum(len(e.stale) + len(e.wrong) for e in self.entries.values())

    def entry(self, impl: str, entry: Expectation) -> EntryAudit:
        key = (impl, entry.number, entry.label)
        if key not in self.entries:
            self.entries[key] = EntryAudit(impl, entry.label, entry.number)
        return self.entries[key]

    def rows(self) -> list[dict[str, Any]]:
        """One row per entry that claimed or missed a record, in file order: the audit's table."""
        rows = []
        for (impl, number, label), found in sorted(self.entries.items(), key=lambda item: (item[0][1], item[0][0])):
            rows.append({"entry": f"{number}: {label}", "impl": impl, "claimed": found.claimed, "right": found.right,
                         "stale": len(found.stale), "wrong": len(found.wrong), "missed": len(found.missed)})
        return rows

    def examples(self) -> list[str]:
        """A few case ids of every stale, wrong and missed kind, one line each."""
        lines = []
        for (impl, number, label), found in sorted(self.entries.items(), key=lambda item: (item[0][1], item[0][0])):
            for kind, cases in (("stale", found.stale), ("wrong", found.wrong), ("missed", found.missed)):
                for case in cases[:EXAMPLES]:
                    lines.append(f"{kind:6} {number}: {label} ({impl}): {case}")
                if len(cases) > EXAMPLES:
                    lines.append(f"{kind:6} {number}: {label} ({impl}): ... {len(cases) - EXAMPLES} more")
        return lines


# What the audit reads of a record (and what a reader needs to find the case again): the rest
# (tracebacks, timings, the verdict's texts) is left out of the records kept as data.
KEPT = ("case_id", "impl", "impl_version", "outcome", "error", "reason", "verdict", "verdict_note", "expected_entry",
        "machine_facts", "ranks", "rank_layout", "observed")
KEPT_MISMATCH = ("oracle", "subject", "iteration", "count", "total")
KEPT_ENV = ("torch", "gpu", "cuda")


def essentials(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` reduced to what the audit reads: the form cases/records/ keeps (a few hundred
    bytes a case instead of kilobytes), still a valid record."""
    kept = {key: record[key] for key in KEPT if record.get(key) not in (None, "")}
    kept["mismatches"] = [{k: m[k] for k in KEPT_MISMATCH if k in m} for m in record.get("mismatches") or []]
    kept["env"] = {k: v for k, v in (record.get("env") or {}).items() if k in KEPT_ENV}
    return kept


def _failure(record: Mapping[str, Any], fired: Sequence[str]) -> str:
    outcome = record.get("outcome", "")
    if outcome == "mismatch":
        return f"mismatch ({', '.join(fired)})"
    first = (record.get("error") or "").strip().splitlines()
    return f"{outcome}: {first[0][:160]}" if first else outcome


def audit(records: Iterable[Mapping[str, Any]], entries: Sequence[Expectation],
          facts: "Mapping[str, Any] | None" = None) -> Audit:
    """Judge every record again under `entries` and count, per entry, the claims it gets right,
    the stale and wrong ones, and the failures it misses (module docstring).  `facts`: machine
    facts (`models.Machine`) for what a record's own ``machine_facts`` lack (the machine the
    records ran on, as a file keeps it: a model asks what the run did not)."""
    result = Audit()
    for record in records:
        result.records += 1
        impl, outcome = str(record.get("impl", "")), str(record.get("outcome", ""))
        error = record.get("error") or ""
        try:
            case = parse_case_id(str(record.get("case_id", "")))
        except CaseError:
            case = None
        why = unjudged(record, case is not None)
        if why:
            result.not_judged[why] = result.not_judged.get(why, 0) + 1
            continue
        fired = list(dict.fromkeys(m.get("oracle", "") for m in record.get("mismatches") or []))
        version = record.get("impl_version")
        torch_version = (record.get("env") or {}).get("torch")
        shown = f"{record.get('case_id')}: {_failure(record, fired) if outcome != 'pass' else 'pass'}"
        machine = record_machine(record, facts)
        ranks = int(record.get("ranks") or 1)  # an entry with `ranks` claims only runs of that many
        entry = find(entries, impl, case, version=version, torch_version=torch_version, machine=machine, ranks=ranks)
        verdict = judge(outcome, fired, error, entry, impl=impl).verdict
        if entry is not None:
            found = result.entry(impl, entry)
            if verdict in ("pass", "xfail"):
                found.right += 1
            elif verdict == "stale":
                found.stale.append(shown)
            else:
                found.wrong.append(shown)
            continue
        if verdict == "pass":
            result.unclaimed_passes += 1
            continue
        expecting = expecting_entry(entries, impl, outcome, fired, error, version, torch_version, case, machine,
                                    ranks)
        if expecting is None:
            result.new.append(f"{impl} {shown}")
        else:
            result.entry(impl, expecting).missed.append(shown)
    return result


def expecting_entry(entries: Sequence[Expectation], impl: str, outcome: str, fired: Sequence[str], error: str,
                    version: "str | None" = None, torch_version: "str | None" = None, case: Any = None,
                    machine: "Machine | None" = None, ranks: int = 1) -> Expectation | None:
    """The entry of `impl` (at `version`, on `torch_version`) that expects just this failure though
    its cases do not reach the case: its outcome, its oracles among `fired`, its message.  A model
    entry expects it where its model alone, outside the entry's scope (its facts and patterns),
    predicts this failure for `case`; without a case, no model entry does.  Of several, the one
    naming the most oracles (the first in the file among equals); None when no entry expects it.
    `ranks`: how many ranks the run had (an entry for more never expects it).  A pointer for a
    reader, never a verdict: the case stays a failure."""
    expecting = []
    for entry in entries:
        if (not fnmatch.fnmatchcase(impl, entry.impl) or entry.expects_pass or entry.ranks > ranks
                or not entry.applies_to(version, torch_version)):
            continue
        if entry.model is not None:
            if case is None:
                continue
            alone = predict([entry.model], case, machine or LOCAL)
            if alone.outcome == "pass":
                continue
            entry = dataclasses.replace(entry, outcomes=(alone.outcome,), oracles=alone.oracles,
                                        message=alone.message, prediction=alone)
        if entry.explains(outcome, list(fired), error):
            expecting.append(entry)
    if not expecting:
        return None
    most = max(len(e.oracles) for e in expecting)
    return next(e for e in expecting if len(e.oracles) == most)


def unjudged(record: Mapping[str, Any], matrix_case: bool = True) -> str:
    """Why `record` is judged for no entry ('' where it is judged): not a matrix or fuzz case
    (`matrix_case` False: module mode), unsupported or skipped, the device out of memory, a fuzz
    failure a second run did not repeat (`NOT_REPEATED`), an error raised outside the impl."""
    outcome, error = str(record.get("outcome", "")), str(record.get("error") or "")
    if not matrix_case:
        return "not a matrix or fuzz case (module mode)"
    if outcome in ("unsupported", "skipped"):
        return outcome
    if outcome == "error" and out_of_device_memory(error):
        return "out of device memory"
    if str(record.get("verdict_note") or "").startswith(NOT_REPEATED):
        return "not repeated by a second run"
    if outcome == "error" and error.startswith(OUTSIDE_IMPL):
        return "raised outside the impl"
    return ""


def record_machine(record: Mapping[str, Any], fallback: "Mapping[str, Any] | None" = None) -> Machine:
    """What the installed torch did where `record` ran, for the models: the facts the record keeps
    (``machine_facts``), then `fallback`'s (facts of that machine kept in a file), and where it
    ran on this torch, what this machine answers besides."""
    torch_version = (record.get("env") or {}).get("torch")
    facts = record.get("machine_facts")
    import torch

    observed = record.get("observed")  # what the run saw (`partition_watch`), asked or not
    known = {**(fallback or {}), **(observed if isinstance(observed, Mapping) else {}),
             **(facts if isinstance(facts, Mapping) else {})}
    return Machine(known, probe=torch_version == torch.__version__)
