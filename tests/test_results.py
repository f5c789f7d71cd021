"""The result contract (harness.results): one record type, its JSON form both ways, its checks,
and the vocabulary the rest of the harness takes from it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness import axes, results
from harness.results import CaseRecord, Mismatch, Outcome, Verdict

CASE = "nonreentrant-tracked-eager-flat-none-cpu"
MISMATCH = Mismatch("recompute-mask", "s0", 1, 3, 16, (2, 5), "True", "False", "")


def judged() -> CaseRecord:
    record = CaseRecord(CASE, "torch", Outcome.MISMATCH, impl_version="2.13.0",
                        axes={"mode": "nonreentrant", "layout": "tracked", "program": "flat"},
                        mismatches=[MISMATCH], duration_s=0.123457, timings={"setup": 0.5}, iterations=2)
    record.verdict, record.expected_failure, record.expected_outcome = Verdict.XFAIL, "why", "mismatch"
    record.expected_oracles, record.expected_entry = ["recompute-mask"], "a-bug"
    record.env, record.worker = {"host": "h"}, "gw0"
    return record


def test_a_record_survives_its_json_line_unchanged():
    record = judged()
    line = json.dumps(record.to_json(), sort_keys=True)
    back = CaseRecord.from_json(json.loads(line))
    assert back == record
    assert back.mismatches[0].first_index == (2, 5)  # a tuple again, as the oracles made it
    assert json.dumps(back.to_json(), sort_keys=True) == line


def test_an_unjudged_record_writes_no_verdict_and_a_judged_one_writes_them_all():
    data = CaseRecord(CASE, "bundled", Outcome.PASS).to_json()
    assert "verdict" not in data and "expected_entry" not in data and "env" not in data
    data = judged().to_json()
    for key in ("verdict", "verdict_note", "expected_failure", "expected_issue", "expected_outcome",
                "expected_oracles", "expected_entry", "env", "worker"):
        assert key in data
    assert data["mode"] == "nonreentrant" and data["outcome"] == "mismatch" and data["duration_s"] == 0.123457
    assert CaseRecord(CASE, "x", Outcome.PASS, duration_s=0.1234567).to_json()["duration_s"] == 0.123457


def test_an_old_record_missing_fields_loads_and_unknown_fields_are_kept():
    old = {"impl": "torch", "case_id": CASE, "outcome": "pass", "mismatches": [{"oracle": "gradient"}],
           "kind": "module", "factory": "examples.mlp:factory"}
    record = CaseRecord.from_json(old)
    assert record.verdict is None and record.reason == "" and record.iterations == 2
    assert record.mismatches == [Mismatch("gradient", "", 0, 0, 0)]
    assert record.extra == {"kind": "module", "factory": "examples.mlp:factory"}
    assert record.to_json()["factory"] == "examples.mlp:factory"


@pytest.mark.parametrize("bad, problem", [
    ({"impl": "x", "case_id": CASE}, "record lacks outcome"),
    ({"impl": 3, "case_id": CASE, "outcome": "pass"}, "impl must be a string, not a number"),
    ({"impl": "x", "case_id": CASE, "outcome": "fine"}, "outcome 'fine' is none of"),
    ({"impl": "x", "case_id": CASE, "outcome": "pass", "verdict": "ok"}, "verdict 'ok' is none of"),
    ({"impl": "x", "case_id": CASE, "outcome": "pass", "mismatches": {}}, "mismatches must be a list"),
    ({"impl": "x", "case_id": CASE, "outcome": "pass", "mismatches": [1]}, "mismatches[0] must be an object"),
    ({"impl": "x", "case_id": CASE, "outcome": "pass", "env": "h"}, "env must be an object or null"),
])
def test_a_record_that_breaks_the_contract_is_refused_with_what_breaks_it(bad, problem):
    assert results.record_problem(bad).startswith(problem)
    with pytest.raises(results.RecordError, match=problem.replace("[", r"\[")):
        CaseRecord.from_json(bad)


def test_the_vocabulary_is_one_and_agrees_with_the_model():
    assert results.AXES == tuple(axes.AXES)
    assert set(results.OUTCOMES) == {o.value for o in Outcome}
    assert set(results.VERDICTS) == {v.value for v in Verdict}
    from harness.model.cases import AXES as case_axes
    from harness.verdict.expectations import OUTCOMES as entry_outcomes

    assert case_axes is axes.AXES
    assert set(entry_outcomes) == {"pass", *results.FAILED_OUTCOMES}


def test_the_contract_and_the_report_load_without_torch():
    code = ("import sys; import harness.results, harness.axes, harness.report.cli; "
            "print('torch' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False"
