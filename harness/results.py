"""The result contract: what a run says about one case, as data (no torch).

Everything that writes a line of results.jsonl builds a `CaseRecord` (the matrix's runner with the
verdict `execution` gives it, module mode, the pytest plugin and the command line adding where it
ran) and writes `CaseRecord.to_json()`; everything that reads one back (the report commands, an
isolated worker's answer) goes through `CaseRecord.from_json`, which checks the contract
(`record_problem`) and reads records written before a field existed (a missing field is empty).

The vocabulary lives here once: the seven outcomes, the five verdicts, the oracle names, the axis
columns, and `Mismatch`, one failed oracle check.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Mapping

from .errors import UsageError

# The start of the error of a case whose exception never passed through the impl's code: a bug of
# the harness (or torch raising in the harness's own calls).  `execution` fails such a case
# whatever the expectations say, and the audit counts it for no entry: it is no verdict on the impl.
OUTSIDE_IMPL = "raised outside the impl (a harness bug, or torch in the harness's own code): "
# The verdict note of a fuzz failure a second run did not repeat bit for bit: run-to-run noise of a
# nondeterministic backward, counted for no entry by the audit.
NOT_REPEATED = "not repeated bit for bit by a second run (a nondeterministic backward's noise)"


def out_of_device_memory(error: str) -> bool:
    """Whether a case's `error` is the device running out of memory: the machine's state (other
    processes on the GPU), no verdict on the impl or on its expectation."""
    return error.removeprefix(OUTSIDE_IMPL).startswith("OutOfMemoryError")


class Outcome(str, enum.Enum):
    """What happened to one case (before any expectation is consulted)."""

    PASS = "pass"
    MISMATCH = "mismatch"
    ERROR = "error"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"
    CRASH = "crash"  # the process running the case died (abort, segfault, sticky CUDA error)
    TIMEOUT = "timeout"  # the case ran past its time limit and its process was killed
    # module mode: no RNG oracle failed, and every gradient and output that differs is within
    # rounding of the reference (the same terms added in another order); not a failure by default
    ROUNDING = "rounding"


class Verdict(str, enum.Enum):
    """How a result counts once its expectation is consulted."""

    PASS = "pass"
    FAIL = "fail"  # an unexpected failure, a wrong failure, or a must-support case declared unsupported
    XFAIL = "xfail"  # the failure an expectation entry names
    STALE = "stale"  # an expected failure that passed
    SKIP = "skip"  # unsupported or skipped


FAILED_OUTCOMES = ("mismatch", "error", "crash", "timeout")
SKIPPED_OUTCOMES = ("unsupported", "skipped")
OUTCOMES = ("pass", "rounding", *FAILED_OUTCOMES, *SKIPPED_OUTCOMES)  # rounding: module mode only
VERDICTS = tuple(v.value for v in Verdict)
ORACLES = ("forward-mask", "recompute-mask", "gradient", "buffer", "live-stream", "fresh-randomness",
           "output", "identity", "ambient", "rank-streams")
# The case's axes and program factors, one column each (`cases.AXES` holds their value enums;
# a test ties the two), then the program's name.
AXES = ("mode", "layout", "capture", "nesting", "interleave", "device", "op", "dtype", "shape", "passing")
AXIS_COLUMNS = (*AXES, "program")
AS_BUILT = "as-built"  # module mode's impl name where the model's own checkpointing is judged
# The RNG APIs a record's env reports (``rng_apis``: "name=yes, name=no, ..."), in order;
# "capture-time get_state" is probed, not looked up (`harness.run.environment`).
RNG_APIS = (
    "Generator.graphsafe_get_state",
    "CUDAGraph.register_generator_state",
    "Generator.philox_state",
    "capture-time get_state",
)


class RecordError(UsageError):
    """A results.jsonl record that breaks the contract (`record_problem` says how)."""


@dataclass(frozen=True)
class Mismatch:
    """One failed oracle check: what, where, when, how many, and the first difference."""

    oracle: str  # one of ORACLES
    subject: str  # site, tensor or stream name
    iteration: int
    count: int  # differing elements
    total: int
    first_index: Any = None  # index of the first differing element (a tuple for n-d tensors)
    got: str = ""
    expected: str = ""
    detail: str = ""

    def message(self) -> str:
        """One line in PyTorch's shape: 'Mismatched elements: k / n ... first at index i: ...'."""
        head = f"{self.oracle} {self.subject} iteration {self.iteration}: "
        if self.detail and self.count == 0:
            return head + self.detail
        pct = 100.0 * self.count / self.total if self.total else 0.0
        text = head + f"Mismatched elements: {self.count} / {self.total} ({pct:.1f}%)"
        if self.first_index is not None:
            text += f", first at index {self.first_index}: got {self.got}, expected {self.expected}"
        if self.detail:
            text += f" ({self.detail})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`first_index` a list)."""
        data = asdict(self)
        if isinstance(self.first_index, tuple):
            data["first_index"] = list(self.first_index)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Mismatch":
        """Back from `to_dict` (first_index a tuple again); fields an older or hand-written record
        lacks take their defaults, unknown ones are ignored."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        index = known.get("first_index")
        return cls(**{**_MISMATCH_DEFAULTS, **known,
                      "first_index": tuple(index) if isinstance(index, list) else index})


_MISMATCH_DEFAULTS = {"oracle": "?", "subject": "", "iteration": 0, "count": 0, "total": 0}


@dataclass
class CaseRecord:
    """One line of results.jsonl: one case for one impl, its outcome, its verdict, where it ran.

    `axes` holds `AXIS_COLUMNS` (each a top-level key in JSON).  The verdict fields are empty until
    `execution` (or module mode) judges the result; `env`, `worker`, `gpu` and `interrupted` are
    filled by whoever writes the record.  `extra` holds the fields one kind of run adds (module
    mode's ``kind``, ``factory``, ...), written as top-level keys too.
    """

    case_id: str
    impl: str
    outcome: Outcome
    impl_version: str | None = None
    axes: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # why unsupported or skipped
    error: str = ""  # "Type: message" when the impl raised
    traceback: str = ""
    mismatches: list[Mismatch] = field(default_factory=list)
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    iterations: int = 2
    verdict: Verdict | None = None
    verdict_note: str = ""
    expected_failure: str = ""
    expected_issue: str = ""
    expected_outcome: str = ""
    expected_oracles: list[str] = field(default_factory=list)
    expected_entry: str | None = None  # None: the key is absent (module runs, older records)
    env: dict[str, Any] | None = None
    worker: str | None = None
    gpu: str | None = None
    interrupted: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as results.jsonl holds it (a flat dict of JSON values)."""
        data: dict[str, Any] = {"case_id": self.case_id, "impl": self.impl, "impl_version": self.impl_version,
                                **self.axes, "outcome": Outcome(self.outcome).value, "reason": self.reason,
                                "error": self.error, "traceback": self.traceback,
                                "mismatches": [m.to_dict() for m in self.mismatches],
                                "duration_s": round(self.duration_s, 6), "timings": dict(self.timings),
                                "iterations": self.iterations}
        data.update(self.extra)
        if self.verdict is not None:
            data.update({"verdict": Verdict(self.verdict).value, "verdict_note": self.verdict_note,
                         "expected_failure": self.expected_failure, "expected_issue": self.expected_issue,
                         "expected_outcome": self.expected_outcome,
                         "expected_oracles": list(self.expected_oracles)})
        for name in ("expected_entry", "env", "worker", "gpu", "interrupted"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CaseRecord":
        """The record a results.jsonl object holds; `RecordError` when it breaks the contract.

        A record written before a field existed reads with that field empty; keys this version
        does not know are kept in `extra`, so a record read and written again loses nothing.
        """
        problem = record_problem(data)
        if problem:
            raise RecordError(problem)
        known = {f.name for f in fields(cls)} - {"axes", "extra"}
        extra = {k: v for k, v in data.items() if k not in known and k not in AXIS_COLUMNS}
        verdict = data.get("verdict")
        return cls(
            case_id=data["case_id"], impl=data["impl"], outcome=Outcome(data["outcome"]),
            impl_version=data.get("impl_version"),
            axes={k: data[k] for k in AXIS_COLUMNS if k in data},
            reason=_text(data.get("reason")), error=_text(data.get("error")),
            traceback=_text(data.get("traceback")),
            mismatches=[Mismatch.from_dict(m) for m in data.get("mismatches") or []],
            duration_s=float(data.get("duration_s") or 0.0), timings=dict(data.get("timings") or {}),
            iterations=int(data.get("iterations") or 2),
            verdict=Verdict(verdict) if verdict else None, verdict_note=_text(data.get("verdict_note")),
            expected_failure=_text(data.get("expected_failure")),
            expected_issue=_text(data.get("expected_issue")),
            expected_outcome=_text(data.get("expected_outcome")),
            expected_oracles=[str(o) for o in data.get("expected_oracles") or []],
            expected_entry=data.get("expected_entry"), env=data.get("env"), worker=data.get("worker"),
            gpu=data.get("gpu"), interrupted=data.get("interrupted"), extra=extra,
        )


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def record_problem(record: Mapping[str, Any]) -> str:
    """What breaks the record contract, in a few words; "" for a good record.

    Required: impl, case_id (strings) and outcome (one of the seven outcomes).  Where present:
    verdict is one of the five verdicts, mismatches a list of objects, env an object (or null).
    Fields a record lacks (older reports) count as empty.
    """
    missing = [key for key in ("impl", "case_id", "outcome") if key not in record]
    if missing:
        return f"record lacks {', '.join(missing)}"
    for key in ("impl", "case_id"):
        if not isinstance(record[key], str):
            return f"{key} must be a string, not {_json_type(record[key])}"
    if record["outcome"] not in OUTCOMES:
        return f"outcome {record['outcome']!r} is none of {', '.join(OUTCOMES)}"
    if "verdict" in record and record["verdict"] not in VERDICTS:
        return f"verdict {record['verdict']!r} is none of {', '.join(VERDICTS)}"
    if "mismatches" in record:
        found = record["mismatches"]
        if not isinstance(found, list):
            return f"mismatches must be a list, not {_json_type(found)}"
        bad = next((i for i, m in enumerate(found) if not isinstance(m, dict)), None)
        if bad is not None:
            return f"mismatches[{bad}] must be an object, not {_json_type(found[bad])}"
    if record.get("env") is not None and not isinstance(record["env"], dict):
        return f"env must be an object or null, not {_json_type(record['env'])}"
    return ""


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def as_json(records: Iterable["CaseRecord | Mapping[str, Any]"]) -> list[dict[str, Any]]:
    """Records as results.jsonl dicts (copies), whether built here or read back as dicts."""
    return [r.to_json() if isinstance(r, CaseRecord) else dict(r) for r in records]
