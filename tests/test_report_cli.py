"""Report commands: report, merge (shards, GPU types), compare, and their bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import ENV_A, ENV_B, MISMATCH, rec

from harness import report, results
from harness.fronts.cli import main

ROOT = Path(__file__).resolve().parent.parent
IDS = ["reentrant-default-eager-flat-none-cpu", "reentrant-tracked-eager-flat-none-cpu",
       "nonreentrant-mixed-eager-nested-draws-cpu", "nonreentrant-shared-eager-siblings-none-cpu"]


def write(directory: Path, records: list[dict]) -> Path:
    return report.write(records, directory, step_summary=False)


def lines_of(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


def test_merge_keeps_each_environment_and_loses_nothing(tmp_path, capsys):
    a = write(tmp_path / "h100", [rec(i, env=ENV_A) for i in IDS] + [rec(IDS[1], impl="torch", outcome="mismatch")])
    b = write(tmp_path / "a100", [rec(i, env=ENV_B) for i in IDS] + [rec(IDS[1], impl="torch", outcome="pass",
                                                                          env=ENV_B)])
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "all")]) == 0
    assert "merged 10 cases from 2 reports (2 environments)" in capsys.readouterr().out
    merged = lines_of(tmp_path / "all")
    assert len(merged) == 10
    key = lambda r: (r["impl"], r["case_id"], r["env"]["gpu"], r["env"]["host"])  # noqa: E731
    assert sorted(map(key, merged)) == sorted(map(key, lines_of(a) + lines_of(b)))
    summary = (tmp_path / "all" / "summary.md").read_text()
    assert "## Environments" in summary and "| NVIDIA H100 (sm_90) x1 " in summary
    assert "### torch · reentrant · NVIDIA A100-SXM4-80GB (sm_80) x1" in summary
    assert "### torch · reentrant · NVIDIA H100 (sm_90) x1" in summary
    page = (tmp_path / "all" / "report.html").read_text()
    assert page.count('<table class="matrix">') == 6  # 2 impls x 2 envs, bundled with 2 modes


def test_merging_shards_of_one_job_joins_them_and_drops_exact_duplicates(tmp_path, capsys):
    one = write(tmp_path / "s1", [rec(i) for i in IDS[:3]])
    two = write(tmp_path / "s2", [rec(i) for i in IDS[2:]])
    assert main(["merge", str(one), str(two / "results.jsonl"), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "merged 4 cases from 2 reports (1 environment)" in out
    assert "1 case appeared in more than one input with the same result" in out
    assert len(lines_of(tmp_path / "m")) == 4


def test_merge_refuses_to_overwrite_a_report_it_was_not_given(tmp_path):
    one = write(tmp_path / "s1", [rec()])
    other = write(tmp_path / "other", [rec(IDS[1])])
    before = (other / "results.jsonl").read_bytes()
    assert main(["merge", str(one), "--out", str(other)]) == 2
    assert (other / "results.jsonl").read_bytes() == before
    assert main(["merge", str(one), str(other), "--out", str(other)]) == 0  # merging into it: fine
    assert len(lines_of(other)) == 2


def test_compare_lists_new_failures_fixed_and_changed_and_exits_1_on_a_new_failure(tmp_path, capsys):
    base = write(tmp_path / "base", [rec(IDS[0]), rec(IDS[1], outcome="mismatch"), rec(IDS[2]),
                                     rec(IDS[3], outcome="mismatch", expected="known")])
    new = write(tmp_path / "new", [rec(IDS[0], outcome="mismatch"), rec(IDS[1]), rec(IDS[2]),
                                   rec(IDS[3], outcome="error", error="RuntimeError: boom", expected="known")])
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "New failures: 1\n  bundled reentrant-default-eager-flat-none-cpu" in out
    assert "pass -> mismatch" in out and "rerun: python -m harness repro reentrant-default-eager-flat-none-cpu" in out
    assert "Fixed: 1\n  bundled reentrant-tracked-eager-flat-none-cpu" in out and "mismatch -> pass" in out
    assert "Changed results: 1\n  bundled nonreentrant-shared-eager-siblings-none-cpu" in out
    assert "mismatch (xfail) -> error (xfail)" in out
    assert main(["compare", str(new), str(new)]) == 0
    assert "New failures: 0" in capsys.readouterr().out


def test_compare_matches_the_same_gpu_on_another_runner_and_keeps_other_gpus_apart(tmp_path, capsys):
    base = write(tmp_path / "base", [rec(IDS[0], env=ENV_A), rec(IDS[0], env=ENV_B)])
    renamed = {**ENV_A, "host": "ci-zzz"}
    new = write(tmp_path / "new", [rec(IDS[0], env=renamed, outcome="mismatch"), rec(IDS[0], env=ENV_B)])
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "New failures: 1" in out and "NVIDIA H100 (sm_90) x1 @ ci-zzz" in out
    assert "Only in base (not run in new: a regression unless --allow-missing): 0" in out
    assert "Only in new (not run in base): 0" in out


def test_compare_fails_when_cases_of_the_base_did_not_run_unless_allowed(tmp_path, capsys):
    # A run that lost most of its cases (a crashed shard, a narrower selection by mistake) must not
    # compare green: a case that did not run is never fine.
    base = write(tmp_path / "base", [rec(IDS[0]), rec(IDS[1]), rec(IDS[2])])
    new = write(tmp_path / "new", [rec(IDS[0])])
    assert main(["compare", str(base), str(new)]) == 1
    captured = capsys.readouterr()
    assert "Only in base (not run in new: a regression unless --allow-missing): 2" in captured.out
    assert "error: 2 case(s) of" in captured.err and "--allow-missing" in captured.err
    assert main(["compare", str(base), str(new), "--allow-missing"]) == 0
    assert "Only in base (not run in new; allowed): 2" in capsys.readouterr().out
    assert main(["compare", str(new), str(base)]) == 0  # new cases alone are listed, not a failure


@pytest.mark.parametrize("content, message", [
    ('{"impl": "a", "case_id": "b", "outcome": "pass"}\n{"impl": "a", "case_id"', ":2: truncated record"),
    ('{"impl": "a", "case_id": "b", "outcome": "pass"}\nnot json\n{}\n', ":2: not a JSON record"),
    ('[1, 2]\n', ":1: not a JSON object"),
    ('{"impl": "a"}\n', ":1: record lacks case_id, outcome"),
    ("\n\n", "holds no results"),
])
def test_a_bad_results_file_is_one_line_naming_file_and_line(tmp_path, capsys, content, message):
    (tmp_path / "results.jsonl").write_text(content)
    commands = [["merge", str(tmp_path), "--out", str(tmp_path / "m")], ["compare", str(tmp_path), str(tmp_path)]]
    if "truncated" not in message:  # `report` rebuilds a killed run's file: see the test below
        commands.append(["report", str(tmp_path)])
    for args in commands:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and str(tmp_path / "results.jsonl") in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "summary.md").exists()


GOOD = {"impl": "a", "case_id": "b", "outcome": "pass"}


@pytest.mark.parametrize("bad, message", [
    ({"outcome": "flaky"},
     "outcome 'flaky' is none of pass, rounding, mismatch, error, crash, timeout, unsupported, skipped"),
    ({"verdict": "maybe"}, "verdict 'maybe' is none of pass, fail, xfail, stale, skip"),
    ({"verdict": None}, "verdict None is none of"),
    ({"mismatches": "recompute-mask"}, "mismatches must be a list, not a string"),
    ({"mismatches": None}, "mismatches must be a list, not null"),
    ({"mismatches": [{"oracle": "gradient"}, 3]}, "mismatches[1] must be an object, not a number"),
    ({"env": "H100"}, "env must be an object or null, not a string"),
    ({"env": [1]}, "env must be an object or null, not a list"),
    ({"impl": 3}, "impl must be a string, not a number"),
    ({"case_id": None}, "case_id must be a string, not null"),
])
def test_a_record_that_breaks_the_contract_is_one_line_naming_file_and_line(tmp_path, capsys, bad, message):
    (tmp_path / "results.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **bad}) + "\n")
    for args in (["report", str(tmp_path)], ["merge", str(tmp_path), "--out", str(tmp_path / "m")],
                 ["compare", str(tmp_path), str(tmp_path)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tmp_path / 'results.jsonl'}:2: {message}" in err, err
    assert not (tmp_path / "m").exists() and not (tmp_path / "summary.md").exists()


def test_null_env_missing_new_fields_and_every_outcome_and_verdict_read_fine(tmp_path):
    from harness.report import cli

    lines = [{**GOOD, "case_id": f"c{i}", "outcome": outcome} for i, outcome in enumerate(report.OUTCOMES)]
    lines += [{**GOOD, "case_id": f"v{i}", "verdict": name, "env": None, "mismatches": []}
              for i, name in enumerate(report.VERDICTS)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert len(cli.read_results(tmp_path)) == len(report.OUTCOMES) + len(report.VERDICTS)
    assert results.record_problem(GOOD) == ""


def test_compare_counts_a_passing_case_that_became_unsupported_or_skipped_as_a_regression(tmp_path, capsys):
    base = write(tmp_path / "base", [rec(IDS[0]), rec(IDS[1]), rec(IDS[2], outcome="unsupported", reason="r")])
    new = write(tmp_path / "new", [rec(IDS[0], outcome="unsupported", reason="ImportError: no megatron"),
                                   rec(IDS[1], outcome="skipped", reason="no CUDA device is visible"),
                                   rec(IDS[2], outcome="unsupported", reason="r")])
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "Regressions (passed in base, unsupported or skipped in new): 2" in out
    assert "bundled reentrant-default-eager-flat-none-cpu [NVIDIA H100 (sm_90) x1 @ ci-a]: pass -> unsupported" in out
    assert "    ImportError: no megatron\n    rerun: python -m harness repro" in out
    assert "pass -> skipped" in out and "New failures: 0" in out and "Changed results: 0" in out
    assert main(["compare", str(new), str(base)]) == 0  # unsupported -> pass is no regression
    capsys.readouterr()


def test_compare_counts_a_known_failure_that_now_fails_another_way_as_a_new_failure(tmp_path, capsys):
    note = "wrong failure: expected mismatch (recompute-mask), got mismatch (gradient)"
    gradient = {**MISMATCH, "oracle": "gradient"}
    base = write(tmp_path / "base", [rec(IDS[0], outcome="mismatch", expected="known"),
                                     rec(IDS[1], outcome="error", error="E", expected="known")])
    new = write(tmp_path / "new", [rec(IDS[0], outcome="mismatch", expected="known", mismatches=[gradient],
                                       verdict="fail", verdict_note=note),
                                   rec(IDS[1], outcome="error", error="E", expected="known")])
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "New failures: 1\n  bundled reentrant-default-eager-flat-none-cpu" in out
    assert f"mismatch (xfail) -> mismatch\n    {note}\n    gradient s0 iteration 0" in out
    assert "Changed results: 0" in out
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "base")]) == 0
    capsys.readouterr()


def test_report_rewrites_every_file_from_results_jsonl(tmp_path, capsys):
    target = write(tmp_path / "r", [rec(), rec(IDS[1], outcome="mismatch")])
    (target / "report.html").unlink()
    assert main(["report", str(target)]) == 0
    assert (target / "report.html").exists() and len(lines_of(target)) == 2


def test_bad_input_from_the_shell_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"impl": "a", "case_id": "b", "outcome": "pass"}\n{"trunc')
    args = ["merge", str(tmp_path), "--out", str(tmp_path / "m")]
    proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "results.jsonl:2: truncated record" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_report_rebuilds_a_killed_runs_file_leaving_out_its_truncated_last_line(tmp_path, capsys):
    # a run killed (SIGKILL) while appending leaves the records it flushed and half a line
    target = write(tmp_path / "r", [rec(), rec(IDS[1], outcome="mismatch")])
    (target / "summary.md").unlink()
    with open(target / "results.jsonl", "a") as f:
        f.write('{"impl": "a", "case_id"')
    assert main(["report", str(target)]) == 0
    err = capsys.readouterr().err
    assert "results.jsonl:3: truncated last record left out" in err and err.count("\n") == 1
    assert (target / "summary.md").exists() and len(lines_of(target)) == 2
