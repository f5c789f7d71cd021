"""The run model: what needs attention is decided once, and every view shows the same thing."""

from __future__ import annotations

import json
import re

import pandas as pd
from test_report import rec

from harness import report
from harness.fronts.cli import main
from harness.report import html as report_html
from harness.report import markdown as report_markdown
from harness.report import merge as report_merge
from harness.report import model as report_model

IMPORT_ERROR = "ImportError: No module named 'megatron'"
IDS = ["reentrant-default-eager-flat-none-cpu", "reentrant-tracked-eager-flat-none-cpu",
       "nonreentrant-mixed-eager-nested-draws-cpu", "nonreentrant-shared-eager-siblings-none-cpu"]
WRONG = "wrong failure: expected mismatch (recompute-mask, gradient), got error: TypeError: boom"
TRACEBACK = "Traceback (most recent call last):\n" + "".join(f'  File "x.py", line {i}, in f{i}\n'
                                                            for i in range(1, 30)) + "TypeError: boom"


def megatron_unsupported() -> list[dict]:
    records = [rec(i, impl="megatron", outcome="unsupported", reason=IMPORT_ERROR) for i in IDS[:3]]
    return records + [rec(IDS[3], impl="megatron", outcome="unsupported", reason="no tracker support\nmore")]


def wrong_failure() -> dict:
    return rec(IDS[0], impl="torch", outcome="error", expected="known RNG bug", expected_outcome="mismatch",
               expected_oracles=["recompute-mask", "gradient"], verdict="fail", verdict_note=WRONG,
               error="TypeError: boom\nwith a second line", traceback=TRACEBACK)


def test_unsupported_cases_need_attention_per_impl_with_their_reasons_counted():
    records = [rec(i) for i in IDS] + megatron_unsupported() + [rec(IDS[0], impl="torch", outcome="skipped",
                                                                  reason="no CUDA device is visible")]
    model = report_model.build(records)
    assert not model.attention.nothing
    assert [g.line() for g in model.attention.skips] == [
        f"megatron: 4 unsupported — {IMPORT_ERROR} (3); no tracker support (1)",
        "torch: 1 skipped — no CUDA device is visible (1)",
    ]
    summary = report_markdown.summary(model)
    assert "Nothing" not in summary
    assert "### Unsupported or skipped: 5 cases" in summary
    assert f"- megatron: 4 unsupported — {IMPORT_ERROR} (3); no tracker support (1)" in summary
    page = report_html.render_html(model)
    assert 'class="box skip"' in page and "Nothing:" not in page
    assert "no tracker support" in page and "No module named &#x27;megatron&#x27;" in page


def test_nothing_is_said_only_when_there_is_nothing_at_all():
    clean = [rec(i) for i in IDS] + [rec(IDS[0], impl="torch", outcome="mismatch", expected="known")]
    model = report_model.build(clean)
    assert model.attention.nothing
    assert report_markdown.NOTHING in report_markdown.summary(model)
    assert 'class="box ok"' in report_html.render_html(model)
    for spoiled in (report_model.build(clean + [rec(IDS[1], impl="x", outcome="unsupported", reason="r")]),
                    report_model.build(clean + [rec(IDS[1], impl="x", outcome="skipped")]),
                    report_model.build(clean, problems=["cases match no case: torch: *-nosuch-*"]),
                    report_model.build(clean, interrupted="interrupted after 5 of 9 cases"),
                    report_model.build(clean + [rec(IDS[1], outcome="pass", expected="x")])):
        assert not spoiled.attention.nothing
        assert "Nothing" not in report_markdown.summary(spoiled)
        assert 'class="box ok"' not in report_html.render_html(spoiled)
    skipped = report_model.build(clean + [rec(IDS[1], impl="x", outcome="skipped")])
    assert skipped.attention.skips[0].line() == "x: 1 skipped — no reason given (1)"


def test_attention_comes_in_order_interrupted_failures_stale_problems_unsupported():
    records = [wrong_failure(), rec(IDS[1], outcome="pass", expected="x"), *megatron_unsupported()]
    model = report_model.build(records, problems=["cases match no case: torch: *-nosuch-*"],
                               interrupted="interrupted after 7 of 60 cases")
    summary = report_markdown.summary(model)
    attention = summary.split("## Needs attention", 1)[1].split("\n## ", 1)[0]
    headings = re.findall(r"^### (.*?)(?::|$)", attention, flags=re.M)
    assert headings == ["⚠ Interrupted", "Unexpected failures", "⚠ Stale expectations",
                        "⚠ Expectation problems", "Unsupported or skipped"]
    page = report_html.render_html(model)
    boxes = re.findall(r'<div class="box (\w+)">', page.split('id="attention"', 1)[1].split("</section>", 1)[0])
    assert boxes == ["interrupted", "fail", "stale", "warn", "skip"]


def test_a_wrong_failure_shows_its_note_expectation_and_traceback_tail_everywhere(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    target = report.write([wrong_failure(), rec(IDS[1])], tmp_path / "r")
    model = report_model.build(json.loads(line) for line in (target / "results.jsonl").read_text().splitlines())
    assert [c.note for c in model.attention.failures] == [WRONG]
    summary = (target / "summary.md").read_text()
    assert f"| {WRONG} |" in summary.split("## Needs attention")[1].split("## Outcomes")[0]
    section = summary.split("#### torch · `reentrant-default-eager-flat-none-cpu`")[1]
    assert f"Verdict: fail — {WRONG}" in section
    assert "Expected to fail: mismatch (recompute-mask, gradient): known RNG bug" in section
    assert "Traceback (last 15 of 31 lines):" in section and "line 29, in f29\nTypeError: boom" in section
    assert "line 15, in f15" not in section and "line 16, in f16" in section
    page = (target / "report.html").read_text()
    assert f"Verdict: fail — {WRONG}" in page
    assert "Expected to fail: <i>mismatch (recompute-mask, gradient): known RNG bug</i>" in page
    assert "<pre>TypeError: boom\nwith a second line</pre>" in page  # the full error, not its first line
    tail = re.search(r'<pre class="tb">(.*?)</pre>', page, flags=re.S).group(1)
    assert tail.splitlines()[-1] == "TypeError: boom" and len(tail.splitlines()) == 15
    assert WRONG in step.read_text()
    cases = pd.read_csv(target / "cases.csv", keep_default_na=False)
    assert list(cases[cases["impl"] == "torch"]["verdict_note"]) == [WRONG]
    assert list(cases[cases["impl"] == "torch"]["expected_oracles"]) == ["recompute-mask, gradient"]


def test_a_stale_case_shows_its_note_without_naming_the_verdict_twice():
    note = "stale: expected mismatch (recompute-mask), but the case passed"
    model = report_model.build([rec(IDS[0], outcome="pass", expected="fixed upstream", verdict_note=note)])
    assert [c.note for c in model.attention.stale] == [note]
    summary = report_markdown.summary(model)
    assert "Verdict: stale — expected mismatch (recompute-mask), but the case passed" in summary
    without_note = report_model.build([rec(IDS[0], outcome="pass", expected="fixed upstream")])
    assert without_note.attention.stale[0].note == "expected to fail (mismatch: fixed upstream) but passed"


def test_an_impl_that_must_support_every_case_fails_an_unsupported_one_visibly():
    note = "torch must support every valid case of its device, but declared this one unsupported: no tracker"
    bad = rec(IDS[1], impl="torch", outcome="unsupported", reason="no tracker", verdict="fail", verdict_note=note)
    model = report_model.build([bad, rec(IDS[0], impl="torch")])
    assert [c.note for c in model.attention.failures] == [note]
    assert [g.line() for g in model.attention.skips] == ["torch: 1 unsupported — no tracker (1)"]
    page = report_html.render_html(model)
    assert re.search(r'<a class="sq s-unsupported v-fail" href="#case-torch--' + IDS[1], page)
    assert f'id="{report.frame.anchor(bad)}"' in page
    lines = report_merge.Change("torch", IDS[1], "env", rec(IDS[1], impl="torch", outcome="unsupported",
                                                              reason="no tracker"), bad).line()
    assert "unsupported -> unsupported (fail)" in lines and note in lines


def test_an_interrupted_run_says_so_in_every_file(tmp_path, monkeypatch, capsys):
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    note = "interrupted after 12 of 60 cases"
    target = report.write([rec(IDS[0], outcome="mismatch"), rec(IDS[1])], tmp_path / "r", interrupted=note)
    summary = (target / "summary.md").read_text()
    assert summary.splitlines()[2].startswith(f"> **⚠ The run was interrupted** ({note})")
    assert summary.count(note) == 2  # the banner, and first under Needs attention
    page = (target / "report.html").read_text()
    assert re.search(r'<header><h1>[^<]*</h1>\s*<div class="banner"><b>⚠ The run was interrupted</b> \(' + note, page)
    records = [json.loads(line) for line in (target / "results.jsonl").read_text().splitlines()]
    assert [r["interrupted"] for r in records] == [note, note]
    assert set(pd.read_csv(target / "cases.csv")["interrupted"]) == {note}
    assert set(pd.read_csv(target / "mismatches.csv")["interrupted"]) == {note}
    assert f"The run was interrupted** ({note})" in step.read_text()
    (target / "summary.md").unlink()
    assert main(["report", str(target)]) == 0  # rewritten from results.jsonl: still interrupted
    assert f"({note})" in (target / "summary.md").read_text()
    capsys.readouterr()


def test_an_uninterrupted_run_has_no_interrupted_column_or_banner(tmp_path):
    target = report.write([rec(IDS[0], outcome="mismatch")], tmp_path / "r", step_summary=False)
    assert "interrupted" not in (target / "summary.md").read_text()
    assert "interrupted" not in pd.read_csv(target / "mismatches.csv").columns
    assert "interrupted" not in json.loads((target / "results.jsonl").read_text())


def test_old_records_without_the_new_fields_still_render(tmp_path):
    old = [{"case_id": IDS[0], "impl": "torch", "outcome": "mismatch", "mismatches": [
               {"oracle": "recompute-mask", "subject": "s0", "iteration": 0, "count": 1, "total": 4}]},
           {"case_id": IDS[1], "impl": "torch", "outcome": "error", "error": "E", "expected_failure": "known"},
           {"case_id": IDS[2], "impl": "megatron", "outcome": "unsupported", "reason": IMPORT_ERROR,
            "verdict": "skip", "env": None}]
    model = report_model.build(old)
    assert [c.note for c in model.attention.failures] == [
        "recompute-mask s0 iteration 0: Mismatched elements: 1 / 4 (25.0%)"]
    assert [g.line() for g in model.attention.skips] == [f"megatron: 1 unsupported — {IMPORT_ERROR} (1)"]
    assert [c.record["case_id"] for c in model.failing["xfail"]] == [IDS[1]]
    target = report.write(old, tmp_path / "r", step_summary=False)
    assert "Expected to fail: known" in (target / "summary.md").read_text()
    assert pd.read_csv(target / "cases.csv", keep_default_na=False)["verdict_note"].tolist() == ["", "", ""]


def test_the_model_is_what_every_view_renders(monkeypatch, tmp_path):
    """summary.md, report.html and the step summary come from one model, built once per write."""
    built = []
    real_build = report.build

    def counting(*args, **kwargs):
        built.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(report, "build", counting)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step.md"))
    report.write([wrong_failure(), *megatron_unsupported()], tmp_path / "r")
    assert len(built) == 1
    assert "megatron: 4 unsupported" in (tmp_path / "step.md").read_text()


def test_a_matrix_cell_puts_each_program_in_one_column_its_interleaves_top_to_bottom():
    # the grid flows by column with one row per interleave value: a program's none and draws cases
    # must be consecutive, or the legend ("a column per program") would lie
    ids = ["reentrant-default-eager-flat-none-cpu", "reentrant-default-eager-flat-draws-cpu",
           "reentrant-default-eager-rand.f32.small.positional.flat-none-cpu",
           "reentrant-default-eager-rand.f32.small.positional.flat-draws-cpu",
           "reentrant-default-eager-nested-none-cpu"]
    records = [rec(case_id) for case_id in reversed(ids)]
    [matrix] = report_model.build(records).matrices
    squares = matrix.cells[("default", "eager")].squares
    shown = [s.record["case_id"] if s.record else None for s in squares]
    programs = [[shown[k], shown[k + 1]] for k in range(0, len(shown), 2)]  # columns of two rows
    assert sorted(map(tuple, programs)) == sorted([
        ("reentrant-default-eager-flat-none-cpu", "reentrant-default-eager-flat-draws-cpu"),
        ("reentrant-default-eager-rand.f32.small.positional.flat-none-cpu",
         "reentrant-default-eager-rand.f32.small.positional.flat-draws-cpu"),
        ("reentrant-default-eager-nested-none-cpu", None)])
