"""The report: results as DataFrames, summary.md, report.html, atomic writes, CI conventions."""

from __future__ import annotations

import json
import os
import re

import pytest

from harness import impls, report
from harness.model.cases import parse_case_id
from harness.model.matrix import generate
from harness.report import env as report_env
from harness.report import html as report_html
from harness.report import model as report_model
from harness.report.markdown import md_escape
from harness.results import RNG_APIS
from harness.run import environment as harness_environment
from harness.run.environment import environment
from harness.run.runner import run
from harness.verdict import expectations

ENV_A = {"host": "ci-a", "python": "3.12", "torch": "2.11.0", "cuda": "13.0", "gpu": "NVIDIA H100 (sm_90) x1",
         "rng_apis": "Generator.graphsafe_get_state=yes, CUDAGraph.register_generator_state=yes, "
                     "Generator.philox_state=no, capture-time get_state=yes"}
ENV_B = {**ENV_A, "host": "ci-b", "gpu": "NVIDIA A100-SXM4-80GB (sm_80) x1"}
MISMATCH = {"oracle": "recompute-mask", "subject": "s0", "iteration": 0, "count": 3, "total": 16,
            "first_index": [0, 1], "got": "True", "expected": "False", "detail": ""}


def rec(case_id="reentrant-default-eager-flat-none-cpu", impl="bundled", outcome="pass", expected="",
        env=ENV_A, **extra):
    """A synthetic result record with a verdict, as a run writes it (`extra` overrides any field)."""
    record = {"case_id": case_id, "impl": impl, "impl_version": "0", **parse_case_id(case_id).axis_values(),
              "outcome": outcome, "reason": "", "error": "", "traceback": "", "mismatches": [],
              "duration_s": 0.01, "iterations": 2, "worker": "gw0", "env": env,
              "verdict": report.verdict(outcome, bool(expected)), "verdict_note": "",
              "expected_failure": expected, "expected_issue": "", "expected_outcome": "mismatch" if expected else "",
              "expected_oracles": []}
    record.update(extra)
    if outcome == "mismatch" and not record["mismatches"]:
        record["mismatches"] = [MISMATCH]
    return record


@pytest.fixture(scope="module")
def real_records():
    """Real results: torch fails the tracked layout (a true finding), bundled passes it."""
    torch_impl, bundled = impls.load("torch"), impls.load("bundled")
    records = []
    for case_id in ("reentrant-tracked-eager-flat-none-cpu", "nonreentrant-tracked-eager-nested-draws-cpu",
                    "reentrant-default-eager-flat-none-cpu"):
        case = parse_case_id(case_id)
        for adapter in (torch_impl, bundled):
            record = run(case, adapter).to_dict()
            record["verdict"] = report.verdict(record["outcome"], False)
            records.append(record)
    env = environment()
    for r in records:
        r["worker"], r["env"] = "main", env
    return records


def test_results_frame_is_one_row_per_case_with_axes_outcome_and_mismatches(real_records):
    frame = report.results_frame(real_records)
    assert len(frame) == 6
    for column in ("case_id", "impl", "mode", "layout", "capture", "nesting", "interleave", "device",
                   "outcome", "verdict", "status", "reason", "error", "mismatch_count", "oracles",
                   "first_mismatch", "duration_s", "worker", "env.torch"):
        assert column in frame.columns, column
    failing = frame[(frame["impl"] == "torch") & (frame["layout"] == "tracked")]
    assert set(failing["outcome"]) == {"mismatch"} and (failing["mismatch_count"] > 0).all()
    assert failing["first_mismatch"].str.contains("Mismatched elements: ").all()
    assert set(frame[frame["impl"] == "bundled"]["outcome"]) == {"pass"}


def test_mismatches_frame_has_oracle_site_iteration_k_of_n_and_first_values(real_records):
    frame = report.mismatches_frame(real_records)
    expected_rows = sum(len(r["mismatches"]) for r in real_records)
    assert len(frame) == expected_rows > 0
    row = frame.iloc[0]
    assert row["oracle"] in ("forward-mask", "recompute-mask", "gradient", "live-stream", "fresh-randomness")
    assert 0 < row["count"] <= row["total"] and row["got"] != row["expected"]


def test_frames_of_no_records_are_empty_but_have_their_columns():
    assert list(report.results_frame([]).columns[:3]) == ["impl", "case_id", "env"]
    assert report.mismatches_frame([]).empty


def test_status_tells_known_failures_and_stale_entries_from_plain_outcomes():
    assert report.status(rec(outcome="mismatch")) == "mismatch"
    assert report.status(rec(outcome="mismatch", expected="known")) == "xfail"
    assert report.status(rec(outcome="pass", expected="known")) == "stale"
    assert report.status(rec(outcome="crash", error="SIGSEGV")) == "crash"
    assert report.verdict("timeout", False) == "fail"


def test_summary_has_environment_attention_counts_matrices_and_failing_cases(real_records):
    env = environment()
    text = report.summary_markdown(real_records, env)
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections == ["## Environment", "## Needs attention", "## Outcomes per implementation",
                        "## Layout x capture", "## Failing cases"]
    for api in ("graphsafe_get_state", "register_generator_state", "philox_state", "capture-time get_state"):
        assert api in text
    # the row says what this machine's probe said ("unknown (no CUDA)" on a CPU machine); tabulate pads the cells
    said = report_env.rng_apis(env)["capture-time get_state"]
    assert re.search(rf"\| RNG API: capture-time get_state\s*\| {re.escape(said)}\s*\|", text), text[:1500]
    assert "### torch · reentrant" in text and "### bundled · nonreentrant" in text
    assert "### Unexpected failures: 2" in text
    assert "python -m harness repro reentrant-tracked-eager-flat-none-cpu --impl torch" in text
    assert re.search(r"\| tracked +\| mismatch 1 /1", text)


def test_summary_escapes_pipes_so_tables_keep_their_shape():
    bad = rec(impl="we|ird", outcome="error", error="RuntimeError: a | b\nsecond | line")
    text = report.summary_markdown([bad, rec()])
    assert md_escape("a|b\nc") == "a\\|b c"
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(len(re.findall(r"(?<!\\)\|", line)))
        elif current:
            tables.append(current)
            current = []
    assert len(tables) >= 5
    for widths in tables:
        assert len(set(widths)) == 1, widths  # every row has as many cells as the header
    assert "| we\\|ird" in text and "RuntimeError: a \\| b" in text


def test_stale_entries_and_unmatched_expectations_are_prominent(tmp_path):
    records = [rec(outcome="pass", expected="torch never saves tracker streams"), rec(impl="torch")]
    entries = [expectations.Expectation("torch", ("*-nosuchlayout-*",), "dead entry")]
    report.write(records, tmp_path / "r", unmatched=expectations.entry_problems(entries, impls.registered()),
                 step_summary=False)
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "### ⚠ Stale expectations: 1" in summary and "torch never saves tracker streams" in summary
    assert "### ⚠ Expectation problems: 1" in summary and "*-nosuchlayout-*" in summary
    page = (tmp_path / "r" / "report.html").read_text()
    assert 'class="box stale"' in page and "Stale expectations: 1" in page and "*-nosuchlayout-*" in page


def test_html_is_self_contained_and_failing_squares_link_to_details():
    records = [rec(outcome="mismatch"), rec("reentrant-default-eager-flat-draws-cpu", outcome="error", error="E"),
               rec("reentrant-tracked-eager-flat-none-cpu", outcome="unsupported", reason="no tracker"),
               rec("reentrant-mixed-eager-flat-none-cpu", outcome="pass", expected="x"),
               rec("nonreentrant-default-eager-flat-none-cpu", outcome="mismatch", expected="known"),
               rec("nonreentrant-shared-eager-flat-none-cpu", outcome="skipped", reason="r")]
    page = report_html.render_html(report_model.build(records))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(//|[a-z]+:)(?!#)""", page.replace('href="#', ""))
    assert "@import" not in page and "<link" not in page
    links = set(re.findall(r'<a class="sq s-[a-z]+" href="#([^"]+)"', page))
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert len(links) == 4 and links <= ids  # mismatch, error, stale, xfail; not pass/unsupported/skipped
    for name in ("pass", "mismatch", "error", "unsupported", "skipped", "xfail", "stale"):
        assert f'<span class="sq s-{name}"></span>{name}</span>' in page  # the legend


def test_write_produces_every_file_keeps_envs_and_moves_latest(tmp_path, real_records):
    root = tmp_path / "reports"
    first = report.write(real_records, root / "run1", step_summary=False)
    assert sorted(p.name for p in first.iterdir()) == ["cases.csv", "mismatches.csv", "report.html",
                                                       "results.jsonl", "summary.md"]
    assert os.readlink(root / "latest") == "run1"
    report.write([rec(env=ENV_B)], root / "run2", step_summary=False)
    assert os.readlink(root / "latest") == "run2"
    kept = [json.loads(line) for line in (root / "run2" / "results.jsonl").read_text().splitlines()]
    assert kept[0]["env"] == ENV_B  # a record's own environment wins
    import pandas as pd
    assert len(pd.read_csv(first / "cases.csv")) == 6
    report.write([rec()], tmp_path / "elsewhere", step_summary=False)
    assert not (tmp_path / "latest").exists()  # no stray pointer beside an arbitrary --report-dir


def test_an_empty_run_is_one_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(report.ReportError, match="no results to report"):
        report.write([], tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_an_unusable_directory_is_a_report_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(report.ReportError, match="cannot create report directory"):
        report.write([rec()], tmp_path / "file" / "sub", step_summary=False)
    monkeypatch.setattr(report.os, "access", lambda path, mode: False)
    with pytest.raises(report.ReportError, match="is not writable"):
        report.write([rec()], tmp_path / "ro", step_summary=False)


@pytest.mark.parametrize("crash", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_crash_mid_write_leaves_the_previous_report_intact(tmp_path, monkeypatch, crash):
    target = tmp_path / "r"
    report.write([rec()], target, step_summary=False)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    calls = []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise crash

    monkeypatch.setattr(report.os, "fsync", fsync)
    with pytest.raises(report.ReportError if isinstance(crash, OSError) else KeyboardInterrupt):
        report.write([rec(outcome="mismatch"), rec(impl="torch")], target, step_summary=False)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # no temp files either


def test_a_failing_view_never_costs_the_results(tmp_path, monkeypatch):
    target = tmp_path / "r"
    report.write([rec()], target, step_summary=False)
    monkeypatch.setattr(report_html, "render_html", lambda *a, **k: 1 / 0)
    with pytest.raises(report.ReportError, match="without report.html: report.html: ZeroDivisionError"):
        report.write([rec(), rec(impl="torch")], target, step_summary=False)
    assert len((target / "results.jsonl").read_text().splitlines()) == 2
    assert not (target / "report.html").exists()  # the old page would contradict the new results


def test_a_model_that_cannot_be_built_costs_the_views_but_not_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "build", lambda *a, **k: 1 / 0)
    with pytest.raises(report.ReportError, match="without summary.md, report.html: summary.md: RuntimeError: "
                                                 "the run model could not be built: ZeroDivisionError"):
        report.write([rec(), rec(impl="torch")], tmp_path / "r", step_summary=False)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["cases.csv", "mismatches.csv", "results.jsonl"]


def test_github_step_summary_is_appended_short_and_folded(tmp_path, monkeypatch):
    path = tmp_path / "step.md"
    path.write_text("earlier step output\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
    records = [rec(outcome="mismatch"), rec(outcome="pass", expected="x", impl="torch"), rec(impl="torch2")]
    report.write(records, tmp_path / "r")
    text = path.read_text()
    assert text.startswith("earlier step output\n### Checkpoint RNG harness")
    assert "<details open><summary><b>Unexpected failures: 1</b>" in text
    assert "Stale expectations: 1" in text and "</details>" in text
    assert len(text.encode()) < 20_000


def test_github_step_summary_stays_under_one_mebibyte(tmp_path, monkeypatch):
    path = tmp_path / "step.md"
    path.write_bytes(b"x" * (report.STEP_SUMMARY_LIMIT - 3000) + b"\n")
    cases = [c.id for c in generate(device="cpu")]
    records = [rec(case_id, impl=f"impl{i}", outcome="mismatch") for i in range(5) for case_id in cases]
    assert report.append_step_summary(records, "reports/x", path)
    size = path.stat().st_size
    assert report.STEP_SUMMARY_LIMIT - 3000 < size <= report.STEP_SUMMARY_LIMIT
    path.write_bytes(b"x" * report.STEP_SUMMARY_LIMIT)
    assert not report.append_step_summary(records, "reports/x", path)  # full: nothing appended
    assert path.stat().st_size == report.STEP_SUMMARY_LIMIT
    cut = report.step_summary_markdown(records, "reports/x", 12_000)
    assert len(cut.encode()) <= 12_000 and "more in summary.md" in cut


def test_junit_properties_name_the_case_and_its_mismatches():
    props = dict(report.junit_properties(rec(outcome="mismatch", impl="torch")))
    assert props["harness.impl"] == "torch" and props["harness.layout"] == "default"
    assert props["harness.outcome"] == "mismatch" and props["harness.verdict"] == "fail"
    assert props["harness.mismatch_count"] == "1"
    assert props["harness.mismatch.0"].startswith("recompute-mask s0 iteration 0: Mismatched elements: 3 / 16")
    assert props["harness.repro"] == "python -m harness repro reentrant-default-eager-flat-none-cpu --impl torch"
    assert all(isinstance(v, str) for v in props.values())


def test_environment_header_reports_versions_and_rng_apis_without_cuda():
    env = environment()
    for key in ("host", "python", "torch", "cuda", "gpu", "rng_apis"):
        assert key in env
    apis = report_env.rng_apis(env)
    assert list(apis) == list(RNG_APIS)
    if not harness_environment.torch.cuda.is_available():
        assert apis["capture-time get_state"] == "unknown (no CUDA)"


def test_capture_probe_ends_the_capture_and_puts_the_generator_back(monkeypatch):
    """The probe under a fake CUDA: get_state raising inside the capture is a 'no', the capture is
    ended anyway, and the generator's value is written back."""
    torch = harness_environment.torch
    events = []

    class Gen:
        def get_state(self):
            if "begin" in events and "end" not in events:
                raise RuntimeError("Cannot call CUDAGeneratorImpl::philox_offset_per_thread during capture")
            return "state"

        def set_state(self, value):
            events.append(("set", value))

    class Graph:
        def capture_begin(self, capture_error_mode):
            events.append("begin")

        def capture_end(self):
            events.append("end")

    class Stream:
        def wait_stream(self, other):
            pass

    import contextlib
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    answer = harness_environment._capture_and_ask(Gen())
    assert answer.startswith("no (Cannot call CUDAGeneratorImpl::philox_offset_per_thread")
    assert events == ["begin", "end", ("set", "state")]


def test_junit_properties_reach_junitxml_through_user_properties(tmp_path, monkeypatch):
    """What the plugin does with them: extend `item.user_properties`, which --junitxml writes."""
    import xml.etree.ElementTree as ET

    test_file = tmp_path / "test_one.py"
    test_file.write_text(
        "from harness import report\n"
        "from test_report_props import RECORD\n"
        "def test_case(request):\n"
        "    request.node.user_properties.extend(report.junit_properties(RECORD))\n")
    (tmp_path / "test_report_props.py").write_text(f"RECORD = {rec(outcome='mismatch', impl='torch')!r}\n")
    xml = tmp_path / "junit.xml"
    (tmp_path / "none.ini").write_text("[pytest]\n")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # a bare pytest: only its own junitxml
    assert pytest.main([str(test_file), "-q", "-p", "no:cacheprovider", "--rootdir",
                        str(tmp_path), "-c", str(tmp_path / "none.ini"), f"--junitxml={xml}"]) == 0
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert props["harness.case_id"] == "reentrant-default-eager-flat-none-cpu"
    assert props["harness.verdict"] == "fail" and props["harness.mismatch.0"].startswith("recompute-mask s0")


def test_the_layout_legend_names_spec_programs_which_have_no_nesting():
    # a structure program (a spec) has no nesting: the legend says "spec", not an empty name
    records = [rec(), rec(case_id="reentrant-default-eager-(native_dropout)&(native_dropout)-none-cpu")]
    text = report.summary_markdown(records, ENV_A)
    assert "over nesting (flat, spec) and interleave" in text
