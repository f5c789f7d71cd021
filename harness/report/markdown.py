"""Markdown views of a run model: summary.md and the short GitHub step summary.

Both render a `model.RunModel` and decide nothing themselves.  Tables come from pandas
(`DataFrame.to_markdown`, i.e. tabulate) with `|` escaped in every cell and label, so an error
message or an impl name cannot break a table.
"""

from __future__ import annotations

from typing import Any, Sequence

from .frame import STATUSES, mismatches, record_verdict, repro_command, status, text
from .model import (
    Attention,
    CaseNote,
    Matrix,
    RunModel,
    expectation_text,
    first_line,
    traceback_tail,
    verdict_line,
)

TITLE = "# Checkpoint RNG harness report"
MAX_MISMATCH_LINES = 12  # per failing case in summary.md; results.jsonl keeps all of them
MAX_XFAIL_MISMATCH_LINES = 4  # known failures are many and read alike
NOTHING = "Nothing: every case passed, or failed as the expectations file says."


def md_escape(value: Any) -> Any:
    """A table cell that cannot break the table: `|` escaped, newlines folded to spaces."""
    if not isinstance(value, str):
        return value
    return value.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def table(frame: Any, index: bool = False) -> str:
    """`frame` as a markdown table (tabulate through pandas), every value and label escaped."""
    frame = frame.copy()
    frame = frame.map(md_escape) if hasattr(frame, "map") else frame.applymap(md_escape)
    frame.columns = [md_escape(str(c)) for c in frame.columns]
    if index:
        frame.index = [md_escape(str(i)) for i in frame.index]
    return frame.to_markdown(index=index)


def fence(body: str, lang: str = "") -> list[str]:
    """A code block whose fence is longer than any backtick run inside `body`."""
    longest, run = 0, 0
    for char in body:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    ticks = "`" * max(3, longest + 1)
    return [ticks + lang, body, ticks]


def totals_line(model: RunModel) -> str:
    """'**1260 cases** · 7 impls · 1 environment · 520 pass · **64 unexpected fail** · 676 xfail'."""
    return " · ".join(f"**{t.text}**" if t.loud else t.text for t in model.totals)


def interrupted_banner(model: RunModel) -> list[str]:
    """A quoted warning line (and a blank line) when the run was interrupted; [] otherwise."""
    if not model.interrupted:
        return []
    return [f"> **⚠ The run was interrupted** ({md_escape(model.interrupted)}): this report holds only "
            "the cases that finished.", ""]


def environment_table(model: RunModel) -> str:
    """Field rows, one column per environment: host, GPU, driver, versions and RNG APIs."""
    import pandas as pd

    envs = model.environments
    rows = [[f, *[str(env.get(f, "")) for env in envs.values()]] for f in model.env_fields]
    rows += [[f"RNG API: {name}", *[model.apis[label].get(name, "not recorded") for label in envs]]
             for name in model.api_names]
    return table(pd.DataFrame(rows, columns=["", *envs] if len(envs) > 1 else ["", "value"]))


def matrix_markdown(matrix: Matrix) -> str:
    """Layout x capture of one matrix; nesting and interleave folded into each cell as counts per
    status ('pass 4 · xfail 2 /6')."""
    import pandas as pd

    cells = [[matrix.cells[r, c].text() if (r, c) in matrix.cells else "" for c in matrix.captures]
             for r in matrix.layouts]
    grid = pd.DataFrame(cells, columns=list(matrix.captures))
    grid.insert(0, "layout", list(matrix.layouts))
    return table(grid)


def _case_table(cases: Sequence[CaseNote], multi_env: bool, what: str) -> str:
    import pandas as pd

    rows = []
    for case in cases:
        r = case.record
        row = {"impl": r["impl"], "case": f"`{r['case_id']}`"}
        if multi_env:
            row["environment"] = case.env
        row["outcome"] = r.get("outcome", "")
        row[what] = case.note
        rows.append(row)
    return table(pd.DataFrame(rows))


def attention_lines(attention: Attention, multi_env: bool) -> list[str]:
    """The "Needs attention" section: interrupted, unexpected failures, stale expectations,
    expectation problems, unsupported and skipped cases; "Nothing" only when none of these."""
    lines = ["## Needs attention", ""]
    if attention.nothing:
        return lines + [NOTHING, ""]
    if attention.interrupted:
        lines += ["### ⚠ Interrupted", "",
                  f"The run was interrupted ({md_escape(attention.interrupted)}): the cases that did not "
                  "finish are in no table below.", ""]
    if attention.failures:
        lines += [f"### Unexpected failures: {len(attention.failures)}", "",
                  "Not as the expectations file says: a bug in the implementation, a new known "
                  "limitation to record there, or a known failure that failed differently. Details and "
                  "repro commands are under *Failing cases*.", "",
                  _case_table(attention.failures, multi_env, "what failed"), ""]
    if attention.stale:
        lines += [f"### ⚠ Stale expectations: {len(attention.stale)}", "",
                  "The expectations file says these cases fail, but they **passed**: fix or narrow "
                  "the entries in `cases/expectations.toml` (pytest reports them as XPASS(strict)).", "",
                  _case_table(attention.stale, multi_env, "why it is stale"), ""]
    if attention.problems:
        lines += [f"### ⚠ Expectation problems: {len(attention.problems)}", "",
                  "Entries of the expectations file that can never apply (their cases match no case, "
                  "or their impl names no implementation):", ""]
        lines += [f"- `{md_escape(line)}`" for line in attention.problems] + [""]
    if attention.skips:
        count = sum(group.count for group in attention.skips)
        lines += [f"### Unsupported or skipped: {count} case{'s' * (count != 1)}", "",
                  "Cases an implementation declared it cannot run, or this environment cannot run, "
                  "with their reasons (cases per reason):", ""]
        lines += [f"- {md_escape(group.line())}" for group in attention.skips] + [""]
    return lines


def summary(model: RunModel) -> str:
    """summary.md: the interrupted banner, totals, the environment(s), what needs attention, counts
    per impl, a layout x capture matrix per impl and mode (per environment where there are several),
    then every failing case with its mismatches and a command that reruns it alone."""
    multi_env = model.multi_env
    lines = [TITLE, "", *interrupted_banner(model), totals_line(model), ""]
    lines += ["## Environment" + ("s" if multi_env else ""), "", environment_table(model), ""]
    lines += attention_lines(model.attention, multi_env)
    lines += ["## Outcomes per implementation", "",
              "Outcomes as run; *unexpected fail*: not as the expectations file says; "
              "*known (xfail)*: failed as the expectations file says; *stale*: expected to fail but passed.", "",
              table(model.counts), ""]
    lines += ["## Layout x capture", "",
              f"Each cell counts the cases of one layout and capture over nesting "
              f"({', '.join(n or 'spec' for n in model.nestings)}) "
              f"and interleave ({', '.join(model.interleaves)}), by status: "
              + ", ".join(STATUSES) + ".", ""]
    for matrix in model.matrices:
        lines += [f"### {matrix.title()}", "", matrix_markdown(matrix), ""]
    lines += _failing_lines(model)
    return "\n".join(lines)


def _failing_lines(model: RunModel) -> list[str]:
    headings = {"fail": "Unexpected failures", "stale": "Stale expectations (expected to fail, passed)",
                "xfail": "Known failures (xfail)"}
    lines = ["## Failing cases", ""]
    for name, heading in headings.items():
        cases = model.failing.get(name, ())
        if cases:
            lines += [f"### {heading}: {len(cases)}", ""]
            for case in cases:
                lines += case_section(case)
    if not model.failing_cases():
        lines += ["None.", ""]
    return lines


def case_section(case: CaseNote) -> list[str]:
    """One listed case: title, verdict note, expectation, reason, error and traceback tail,
    mismatch lines, repro command."""
    record = case.record
    where = f" · {case.env}" if case.env else ""
    verdict_name = record_verdict(record)
    lines = [f"#### {record['impl']} · `{record['case_id']}`{where} · {status(record)}", ""]
    if verdict_line(record):
        lines += [f"Verdict: {verdict_line(record)}", ""]
    expected = expectation_text(record)
    if expected:
        issue = f" ({record['expected_issue']})" if text(record, "expected_issue") else ""
        lines += [f"Expected to fail: {expected}{issue}", ""]
    if verdict_name == "stale":
        lines += ["It passed: the expectation is stale.", ""]
    if text(record, "reason") and record.get("outcome") not in ("mismatch", "pass"):
        lines += [f"Reason: {first_line(record['reason'])}", ""]
    if text(record, "error"):
        lines += fence(text(record, "error").rstrip("\n")) + [""]
    tail, count = traceback_tail(record)
    if tail and record.get("outcome") in ("error", "crash"):
        shown = tail.count("\n") + 1
        lines += [f"Traceback (last {shown} of {count} lines):" if shown < count else "Traceback:", ""]
        lines += fence(tail) + [""]
    found = mismatches(record)
    limit = MAX_XFAIL_MISMATCH_LINES if verdict_name == "xfail" else MAX_MISMATCH_LINES
    if found:
        shown_lines = [m.message() for m in found[:limit]]
        if len(found) > limit:
            shown_lines.append(f"... {len(found) - limit} more in results.jsonl")
        lines += fence("\n".join(shown_lines)) + [""]
    lines += ["Rerun alone:", ""] + fence(repro_command(record), "sh") + [""]
    return lines


def step_summary(model: RunModel, report_dir: str, budget: int) -> str:
    """A short summary for GITHUB_STEP_SUMMARY, at most `budget` bytes (UTF-8): the interrupted
    banner, totals, counts per impl, then unexpected failures, stale cases, expectation problems,
    unsupported and skipped cases and the matrices folded in <details>.  Parts that do not fit are
    cut, with a note that the full report is in `report_dir`."""
    multi_env = model.multi_env
    attention = model.attention
    head = ["### Checkpoint RNG harness", "", *interrupted_banner(model), totals_line(model), "",
            table(model.counts), ""]
    tail = ["", "", f"Full report: `{report_dir}` (summary.md, report.html, cases.csv, results.jsonl)", ""]
    out = "\n".join(head)
    if _size(out + "\n".join(tail)) > budget:
        short = "\n".join(["### Checkpoint RNG harness", "", *interrupted_banner(model), totals_line(model)] + tail)
        return short if _size(short) <= budget else ""
    for cases, heading, what, opened in ((attention.failures, "Unexpected failures", "what failed", True),
                                         (attention.stale, "⚠ Stale expectations", "why it is stale", False)):
        if not cases:
            continue
        rows = [f"| {md_escape(c.record['impl'])} | `{c.record['case_id']}` "
                + (f"| {md_escape(c.env)} " if multi_env else "")
                + f"| {md_escape(c.note)} | `{md_escape(repro_command(c.record))}` |" for c in cases]
        header = ["", f"<details{' open' if opened and len(cases) <= 20 else ''}><summary><b>{heading}: "
                  f"{len(cases)}</b></summary>", "",
                  "| impl | case " + ("| environment " if multi_env else "") + f"| {what} | rerun |",
                  "|---|---" + ("|---" if multi_env else "") + "|---|---|"]
        out += "\n".join(_fit(header, rows, ["", "</details>"], budget - _size(out + "\n".join(tail))))
    skipped = sum(g.count for g in attention.skips)
    for items, heading in (([f"`{md_escape(line)}`" for line in attention.problems],
                            f"⚠ Expectation problems: {len(attention.problems)}"),
                           ([md_escape(g.line()) for g in attention.skips],
                            f"Unsupported or skipped: {skipped} case{'s' * (skipped != 1)}")):
        if items:
            header = ["", f"<details><summary><b>{heading}</b></summary>", ""]
            out += "\n".join(_fit(header, [f"- {item}" for item in items], ["", "</details>"],
                                  budget - _size(out + "\n".join(tail))))
    matrices = ["", "<details><summary>Layout x capture per impl and mode</summary>", ""]
    for matrix in model.matrices:
        matrices += [f"**{matrix.title()}**", "", matrix_markdown(matrix), ""]
    block = "\n".join(matrices + ["</details>"])
    if _size(out + block + "\n".join(tail)) <= budget:
        out += block
    return out + "\n".join(tail)


def _fit(header: list[str], rows: list[str], footer: list[str], budget: int) -> list[str]:
    """header + as many rows as fit in `budget` bytes + a 'more' line + footer; [] if none fits."""
    used = _size("\n".join(header + footer)) + 200
    kept = []
    for row in rows:
        if used + _size(row) + 1 > budget:
            break
        kept.append(row)
        used += _size(row) + 1
    if not kept:
        return []
    more = ["", f"... and {len(rows) - len(kept)} more in summary.md"] if len(kept) < len(rows) else []
    return header + kept + more + footer


def _size(value: str) -> int:
    return len(value.encode("utf-8"))
