"""Result records as data: one pandas DataFrame row per case, one per mismatch.

A record is a dict (one line of results.jsonl): `CaseResult.to_dict` plus the verdict the run
gave it (`verdict`, `verdict_note`, the expectation it was held to) and the environment it ran in
(`env`).  Records written before a field existed still read: a missing field counts as empty.
Renderers (markdown, HTML, CSV) read these frames or the run model; nothing here re-runs a case.
"""

from __future__ import annotations

import enum
import re
import shlex
from typing import Any, Iterable, Mapping, Sequence

from ..axes import AXES
from ..rank_context import sizes
from ..results import AS_BUILT, FAILED_OUTCOMES, SKIPPED_OUTCOMES, Mismatch
from .env import env_key, env_labels

# What a case shows as in tables and colours: its outcome, except that known failures read
# "xfail" and expected failures that passed read "stale".
STATUSES = ("pass", "rounding", "mismatch", "error", "crash", "timeout", "stale", "xfail", "unsupported", "skipped")
# Worst first: the status that colours a matrix cell.
SEVERITY = ("crash", "timeout", "error", "mismatch", "stale", "xfail", "rounding", "pass", "unsupported", "skipped")
# Verdicts whose cases are listed one by one under "Failing cases" (and linked from the matrices).
LISTED_VERDICTS = ("fail", "stale", "xfail")

CASE_COLUMNS = (
    "impl", "case_id", "env", *AXES, "outcome", "verdict", "verdict_note", "status", "reason", "error",
    "expected_failure", "expected_outcome", "expected_oracles", "expected_issue", "mismatch_count",
    "oracles", "first_mismatch", "mismatch_lines", "duration_s", "worker", "impl_version", "iterations",
    "repro", "env_key",
)
MISMATCH_COLUMNS = (
    "impl", "case_id", "env", "oracle", "subject", "iteration", "count", "total", "first_index",
    "got", "expected", "detail", "message", "env_key",
)


def verdict(outcome: str, expected: bool) -> str:
    """How a result counts when nothing more is known: fail / xfail for a failed case (mismatch,
    error, crash, timeout), stale for an expected failure that passed, skip for unsupported or
    skipped cases.  (Records of a run carry the verdict the run gave; this is for older ones.)"""
    if outcome in SKIPPED_OUTCOMES:
        return "skip"
    failed = outcome in FAILED_OUTCOMES
    if expected:
        return "xfail" if failed else "stale"
    return "fail" if failed else "pass"


def record_verdict(record: Mapping[str, Any]) -> str:
    """The record's verdict, computed from its outcome where an older record lacks one."""
    return record.get("verdict") or verdict(record.get("outcome", ""), bool(record.get("expected_failure")))


def status(record: Mapping[str, Any]) -> str:
    """What the case shows as: its outcome, or "xfail" / "stale" where the expectations file spoke."""
    found = record_verdict(record)
    return found if found in ("xfail", "stale") else str(record.get("outcome", ""))


def text(record: Mapping[str, Any], name: str) -> str:
    """A text field of the record, "" where it is missing or null."""
    value = record.get(name)
    return "" if value is None else str(value)


def text_list(record: Mapping[str, Any], name: str) -> list[str]:
    """A list-of-strings field (e.g. `expected_oracles`), [] where it is missing or null."""
    value = record.get(name)
    if not value:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def record_key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """A case's identity across runs and merges: impl, case id and environment (GPU and host)."""
    return (str(record["impl"]), str(record["case_id"]), env_key(record.get("env")))


def mismatches(record: Mapping[str, Any]) -> list[Mismatch]:
    """The record's mismatches as `Mismatch` objects (first_index back to a tuple)."""
    return [Mismatch.from_dict(m) for m in record.get("mismatches") or []]


def repro_command(record: Mapping[str, Any]) -> str:
    """A copy-paste command that reruns one case alone (for a module run, `harness module`)."""
    if record.get("kind") == "module":
        return module_command(str(record["factory"]), str(record["impl"]), str(record.get("device", "cpu")),
                              str(record.get("capture", "eager")), str(record.get("mode", "nonreentrant")),
                              record.get("wrap") or [], record.get("iterations"))
    case, impl = shlex.quote(str(record["case_id"])), shlex.quote(str(record["impl"]))
    ranks = int(record.get("ranks") or 1)
    if ranks > 1:  # repro runs one process: a case of several ranks reruns alone through run
        return f"python -m harness run --impl {impl} --case {case} {rank_flags(ranks, record.get('rank_layout'))}"
    return f"python -m harness repro {case} --impl {impl}"


def rank_flags(ranks: int, layout: "str | None") -> str:
    """The command-line flags that give `ranks` ranks in `layout` (`RankContext.label`: tp2 or
    tp2xcp1xdp2), e.g. ``--ranks 4 --tp 2``."""
    flags = f"--ranks {ranks}"
    if not layout or layout == f"tp{ranks}":
        return flags
    axes = sizes(layout)
    flags += f" --tp {axes['tp']}" if axes["tp"] != ranks else ""
    return flags + (f" --cp {axes['cp']}" if axes["cp"] != 1 else "")


def module_command(factory: str, impl: str, device: str, capture: "enum.Enum | str", mode: "enum.Enum | str",
                   wrap: "Sequence[str] | None", iterations: int | None = None) -> str:
    """The command line that repeats one module run (`harness module`)."""
    capture = getattr(capture, "value", capture)
    mode = getattr(mode, "value", mode)
    parts = ["python -m harness module", shlex.quote(factory), "--impl", shlex.quote(impl), "--device", device,
             "--capture", str(capture)]
    if mode != AS_BUILT:
        parts += ["--mode", str(mode)]
    for pattern in wrap or []:
        parts += ["--wrap", shlex.quote(pattern)]
    if iterations and iterations != 2:
        parts += ["--iterations", str(iterations)]
    return " ".join(parts)


def labels_of(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Environment key -> short unique label, over the environments of `records`."""
    envs: dict[str, Mapping[str, Any]] = {}
    for record in records:
        envs.setdefault(env_key(record.get("env")), record.get("env") or {})
    return env_labels(envs)


def environments(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Environment label -> environment, in the order first seen."""
    records = list(records)
    labels = labels_of(records)
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        out.setdefault(labels[env_key(record.get("env"))], dict(record.get("env") or {}))
    return out


def results_frame(records: list[dict[str, Any]]) -> Any:
    """One row per case: identity, every axis, outcome, verdict (and its note), status, reason or
    error, the expectation (reason, outcome, oracles, issue), the mismatches (count, oracles, first
    and all lines), duration, worker and the environment (as `env.<field>` columns).  Extra scalar
    keys of the records (new axes, `interrupted`) come along too."""
    import pandas as pd

    labels = labels_of(records)
    rows = []
    extra: list[str] = []
    for record in records:
        found = mismatches(record)
        key = env_key(record.get("env"))
        row: dict[str, Any] = {
            "impl": record.get("impl", ""), "case_id": record.get("case_id", ""), "env": labels[key],
            **{axis: record.get(axis, "") for axis in AXES},
            "outcome": record.get("outcome", ""), "verdict": record_verdict(record),
            "verdict_note": text(record, "verdict_note"),
            "status": status(record), "reason": text(record, "reason"), "error": text(record, "error"),
            "expected_failure": text(record, "expected_failure"),
            "expected_outcome": text(record, "expected_outcome"),
            "expected_oracles": ", ".join(text_list(record, "expected_oracles")),
            "expected_issue": text(record, "expected_issue"),
            "mismatch_count": len(found),
            "oracles": ", ".join(dict.fromkeys(m.oracle for m in found)),
            "first_mismatch": found[0].message() if found else "",
            "mismatch_lines": "\n".join(m.message() for m in found),
            "duration_s": record.get("duration_s"), "worker": record.get("worker", ""),
            "impl_version": record.get("impl_version"), "iterations": record.get("iterations"),
            "repro": repro_command(record) if "case_id" in record and "impl" in record else "",
            "env_key": key,
        }
        for name, value in record.items():
            if name not in row and name not in ("env", "mismatches", "traceback") and _scalar(value):
                row[name] = value
                if name not in extra:
                    extra.append(name)
        for name, value in (record.get("env") or {}).items():
            row[f"env.{name}"] = value
        rows.append(row)
    env_columns = sorted({c for row in rows for c in row if c.startswith("env.")})
    return pd.DataFrame(rows, columns=[*CASE_COLUMNS, *extra, *env_columns])


def mismatches_frame(records: list[dict[str, Any]]) -> Any:
    """One row per mismatch: the case, oracle, site / stream / tensor, iteration, k of n, the first
    differing index with both values, and the PyTorch-style message.  When a record says the run
    was interrupted (`interrupted`), an `interrupted` column says so on every row."""
    import pandas as pd

    labels = labels_of(records)
    interrupted = any(text(r, "interrupted") for r in records)
    rows = []
    for record in records:
        key = env_key(record.get("env"))
        for m in mismatches(record):
            row = {
                "impl": record["impl"], "case_id": record["case_id"], "env": labels[key],
                "oracle": m.oracle, "subject": m.subject, "iteration": m.iteration, "count": m.count,
                "total": m.total, "first_index": "" if m.first_index is None else str(m.first_index),
                "got": m.got, "expected": m.expected, "detail": m.detail, "message": m.message(),
                "env_key": key,
            }
            if interrupted:
                row["interrupted"] = text(record, "interrupted")
            rows.append(row)
    return pd.DataFrame(rows, columns=[*MISMATCH_COLUMNS, *(["interrupted"] if interrupted else [])])


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def ordered(values: Iterable[str], axis: str) -> list[str]:
    """Distinct axis values in the enum's order, unknown values (new axes' values) after, sorted."""
    present = list(dict.fromkeys(str(v) for v in values))
    known = [v.value for v in AXES[axis]] if axis in AXES else []
    return [v for v in known if v in present] + sorted(v for v in present if v not in known)


def case_sort_key(record: Mapping[str, Any]) -> tuple:
    """Unexpected failures first, then stale, then known failures; by impl, case, environment."""
    rank = {"fail": 0, "stale": 1, "xfail": 2}.get(record_verdict(record), 3)
    return (rank, *record_key(record))


def anchor(record: Mapping[str, Any]) -> str:
    """A stable HTML id for a case's details: readable, and unique per impl, case and environment."""
    import hashlib

    impl, case_id, key = record_key(record)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{impl}--{case_id}")
    return f"case-{slug}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"
