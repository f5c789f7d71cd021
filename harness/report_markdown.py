"""Markdown views of a run: summary.md and the short GitHub step summary.

Tables come from pandas (`DataFrame.to_markdown`, i.e. tabulate) with `|` escaped in every cell
and label, so an error message or an impl name cannot break a table.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .report_env import RNG_APIS, rng_apis
from .report_frame import (
    OUTCOMES,
    STATUSES,
    case_sort_key,
    environments,
    labels_of,
    mismatches,
    ordered,
    record_verdict,
    repro_command,
    results_frame,
    status,
)
from .report_env import env_key

TITLE = "# Checkpoint RNG harness report"
MAX_MISMATCH_LINES = 12  # per failing case in summary.md; results.jsonl keeps all of them
MAX_XFAIL_MISMATCH_LINES = 4  # known failures are many and read alike
ENV_FIELDS = ("host", "gpu", "compute_capability", "driver", "driver (CUDA API)", "torch", "cuda", "python")


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


def fence(text: str, lang: str = "") -> list[str]:
    """A code block whose fence is longer than any backtick run inside `text`."""
    longest, run = 0, 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    ticks = "`" * max(3, longest + 1)
    return [ticks + lang, text, ticks]


def _first_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def counts_frame(frame: Any, by_env: bool) -> Any:
    """Cases per outcome, then per verdict (fail / xfail / stale), per impl (and environment)."""
    import pandas as pd

    keys = ["impl", "env"] if by_env else ["impl"]
    rows = []
    for key, group in frame.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(keys, key))
        outcome_counts = group["outcome"].value_counts()
        verdict_counts = group["verdict"].value_counts()
        for outcome in OUTCOMES:
            row[outcome] = int(outcome_counts.get(outcome, 0))
        row["total"] = len(group)
        row["unexpected fail"] = int(verdict_counts.get("fail", 0))
        row["known (xfail)"] = int(verdict_counts.get("xfail", 0))
        row["stale"] = int(verdict_counts.get("stale", 0))
        rows.append(row)
    out = pd.DataFrame(rows)
    always = {"pass", "mismatch", "error", "total"}
    keep = [c for c in out.columns if c in keys or c in always or out[c].any()]
    return out[keep]


def cell_text(statuses: Iterable[str]) -> str:
    """'pass 4 · xfail 2 /6': how many cases of a matrix cell show each status."""
    values = list(statuses)
    parts = [f"{s} {values.count(s)}" for s in STATUSES if s in values]
    parts += [f"{s} {values.count(s)}" for s in sorted(set(values) - set(STATUSES))]
    return f"{' · '.join(parts)} /{len(values)}"


def matrix_markdown(frame: Any, impl: str, mode: str, env: str | None = None) -> str:
    """Layout x capture for one impl and mode (and environment); nesting and interleave are folded
    into each cell as counts per status."""
    import pandas as pd

    part = frame[(frame["impl"] == impl) & (frame["mode"] == mode)]
    if env is not None:
        part = part[part["env"] == env]
    if part.empty:
        return ""
    rows = ordered(part["layout"], "layout")
    cols = ordered(part["capture"], "capture")
    cells = {(layout, capture): cell_text(group["status"]) for (layout, capture), group
             in part.groupby(["layout", "capture"])}
    grid = pd.DataFrame([[cells.get((r, c), "") for c in cols] for r in rows], columns=cols)
    grid.insert(0, "layout", rows)
    return table(grid)


def environment_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Field rows, one column per environment: host, GPU, driver, versions and RNG APIs."""
    import pandas as pd

    envs = environments(records)
    fields = [f for f in ENV_FIELDS if any(f in env for env in envs.values())]
    fields += sorted({k for env in envs.values() for k in env} - set(ENV_FIELDS)
                     - {"rng_apis", "gpu_name", "gpu_count"})
    apis = {label: rng_apis(env) for label, env in envs.items()}
    api_names = list(RNG_APIS) + sorted({n for a in apis.values() for n in a} - set(RNG_APIS))
    rows = [[field, *[str(env.get(field, "")) for env in envs.values()]] for field in fields]
    rows += [[f"RNG API: {name}", *[apis[label].get(name, "not recorded") for label in envs]] for name in api_names]
    return table(pd.DataFrame(rows, columns=["", *envs] if len(envs) > 1 else ["", "value"]))


def _attention_lines(records: Sequence[Mapping[str, Any]], unmatched: Sequence[str] | None,
                     multi_env: bool) -> list[str]:
    import pandas as pd

    labels = labels_of(records)
    failed = [r for r in records if record_verdict(r) == "fail"]
    stale = [r for r in records if record_verdict(r) == "stale"]
    lines = ["## Needs attention", ""]
    if not failed and not stale and not unmatched:
        return lines + ["Nothing: every case passed, was skipped, or failed as the expectations file says.", ""]

    def case_rows(subset: list[Mapping[str, Any]], what: str) -> Any:
        rows = []
        for r in sorted(subset, key=case_sort_key):
            row = {"impl": r["impl"], "case": f"`{r['case_id']}`"}
            if multi_env:
                row["environment"] = labels[env_key(r.get("env"))]
            row["outcome"] = r.get("outcome", "")
            row[what] = _what(r) if what != "expected failure (now passes)" else _first_line(r.get("expected_failure", ""))
            rows.append(row)
        return pd.DataFrame(rows)

    if failed:
        lines += [f"### Unexpected failures: {len(failed)}", "",
                  "Not in the expectations file: a bug in the implementation, or a new known "
                  "limitation to record there. Details and repro commands are under *Failing cases*.", "",
                  table(case_rows(failed, "first mismatch or error")), ""]
    if stale:
        lines += [f"### ⚠ Stale expectations: {len(stale)}", "",
                  "The expectations file says these cases fail, but they **passed**: fix or narrow "
                  "the entries in `cases/expectations.toml` (pytest reports them as XPASS(strict)).", "",
                  table(case_rows(stale, "expected failure (now passes)")), ""]
    if unmatched:
        lines += [f"### ⚠ Expectation entries that match no case: {len(unmatched)}", ""]
        lines += [f"- `{md_escape(entry)}`" for entry in unmatched] + [""]
    return lines


def _what(record: Mapping[str, Any]) -> str:
    found = mismatches(record)
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        return found[0].message() + more
    return _first_line(record.get("error", "")) or _first_line(record.get("reason", ""))


def summary_markdown(records: list[dict[str, Any]], env: Mapping[str, Any] | None = None, *,
                     unmatched: Sequence[str] | None = None) -> str:
    """summary.md: totals, the environment(s), what needs attention (unexpected failures, stale
    expectations, expectation entries matching no case), counts per impl, a layout x capture matrix
    per impl and mode (per environment where there are several), then every failing case with its
    mismatches and a command that reruns it alone.  `env` fills in records that carry none."""
    records = [r if r.get("env") or env is None else {**r, "env": dict(env)} for r in records]
    frame = results_frame(records)
    envs = list(dict.fromkeys(frame["env"]))
    multi_env = len(envs) > 1
    lines = [TITLE, "", totals_line(records), ""]
    lines += ["## Environment" + ("s" if multi_env else ""), "", environment_table(records), ""]
    lines += _attention_lines(records, unmatched, multi_env)
    lines += ["## Outcomes per implementation", "",
              "Outcomes as run; *unexpected fail*: failed and not in the expectations file; "
              "*known (xfail)*: failed as the expectations file says; *stale*: expected to fail but passed.", "",
              table(counts_frame(frame, multi_env)), ""]
    lines += ["## Layout x capture", "",
              f"Each cell counts the cases of one layout and capture over nesting "
              f"({', '.join(ordered(frame['nesting'], 'nesting'))}) and interleave "
              f"({', '.join(ordered(frame['interleave'], 'interleave'))}), by status: "
              + ", ".join(STATUSES) + ".", ""]
    for impl in sorted(frame["impl"].unique()):
        for env_label in envs:
            for mode in ordered(frame["mode"], "mode"):
                grid = matrix_markdown(frame, impl, mode, env_label)
                if grid:
                    where = f" · {env_label}" if multi_env else ""
                    lines += [f"### {impl} · {mode}{where}", "", grid, ""]
    lines += _failing_lines(records, multi_env)
    return "\n".join(lines)


def totals_line(records: Sequence[Mapping[str, Any]]) -> str:
    """'**1260 cases** · 7 impls · 1 environment · 520 pass · **64 unexpected fail** · 676 xfail'."""
    verdicts = [record_verdict(r) for r in records]
    impls = {r["impl"] for r in records}
    envs = {env_key(r.get("env")) for r in records}
    parts = [f"**{len(records)} cases**", f"{len(impls)} impl{'s' * (len(impls) != 1)}",
             f"{len(envs)} environment{'s' * (len(envs) != 1)}"]
    names = {"pass": "pass", "fail": "unexpected fail", "xfail": "known failures (xfail)",
             "stale": "stale", "skip": "unsupported or skipped"}
    for name, label in names.items():
        count = verdicts.count(name)
        if count:
            parts.append(f"**{count} {label}**" if name in ("fail", "stale") else f"{count} {label}")
    return " · ".join(parts)


def _failing_lines(records: Sequence[Mapping[str, Any]], multi_env: bool) -> list[str]:
    labels = labels_of(records)
    groups = (("fail", "Unexpected failures"), ("stale", "Stale expectations (expected to fail, passed)"),
              ("xfail", "Known failures (xfail)"))
    lines = ["## Failing cases", ""]
    any_failing = False
    for name, heading in groups:
        subset = sorted((r for r in records if record_verdict(r) == name), key=case_sort_key)
        if not subset:
            continue
        any_failing = True
        lines += [f"### {heading}: {len(subset)}", ""]
        for record in subset:
            lines += case_section(record, labels[env_key(record.get("env"))] if multi_env else None)
    if not any_failing:
        lines += ["None.", ""]
    return lines


def case_section(record: Mapping[str, Any], env_label: str | None = None) -> list[str]:
    """One failing (or stale) case: title, expectation, error, mismatch lines, repro command."""
    where = f" · {env_label}" if env_label else ""
    verdict_name = record_verdict(record)
    lines = [f"#### {record['impl']} · `{record['case_id']}`{where} · {status(record)}", ""]
    if record.get("expected_failure"):
        issue = f" ({record['expected_issue']})" if record.get("expected_issue") else ""
        lines += [f"Expected to fail: {_first_line(record['expected_failure'])}{issue}", ""]
    if verdict_name == "stale":
        lines += ["It passed: the expectation is stale.", ""]
    if record.get("error"):
        lines += fence(str(record["error"])) + [""]
    found = mismatches(record)
    limit = MAX_XFAIL_MISMATCH_LINES if verdict_name == "xfail" else MAX_MISMATCH_LINES
    if found:
        text = [m.message() for m in found[:limit]]
        if len(found) > limit:
            text.append(f"... {len(found) - limit} more in results.jsonl")
        lines += fence("\n".join(text)) + [""]
    lines += ["Rerun alone:", ""] + fence(repro_command(record), "sh") + [""]
    return lines


def step_summary_markdown(records: Sequence[Mapping[str, Any]], report_dir: str, budget: int) -> str:
    """A short summary for GITHUB_STEP_SUMMARY, at most `budget` bytes (UTF-8): totals, counts per
    impl, and the unexpected failures, stale cases and matrices folded in <details>.  Parts that do
    not fit are cut, with a note that the full report is in `report_dir`."""
    frame = results_frame(list(records))
    multi_env = frame["env"].nunique() > 1
    labels = labels_of(records)
    head = ["### Checkpoint RNG harness", "", totals_line(records), "",
            table(counts_frame(frame, multi_env)), ""]
    tail = ["", f"Full report: `{report_dir}` (summary.md, report.html, cases.csv, results.jsonl)", ""]
    text = "\n".join(head)
    if _size(text + "\n".join(tail)) > budget:
        short = "\n".join(["### Checkpoint RNG harness", "", totals_line(records)] + tail)
        return short if _size(short) <= budget else ""
    for name, heading in (("fail", "Unexpected failures"), ("stale", "⚠ Stale expectations")):
        subset = sorted((r for r in records if record_verdict(r) == name), key=case_sort_key)
        if not subset:
            continue
        rows = [f"| {md_escape(r['impl'])} | `{r['case_id']}` "
                + (f"| {md_escape(labels[env_key(r.get('env'))])} " if multi_env else "")
                + f"| {md_escape(_what(r) if name == 'fail' else _first_line(r.get('expected_failure', '')))} "
                + f"| `{md_escape(repro_command(r))}` |" for r in subset]
        opened = " open" if name == "fail" and len(subset) <= 20 else ""
        header = ["", f"<details{opened}><summary><b>{heading}: {len(subset)}</b>"
                  "</summary>", "",
                  "| impl | case " + ("| environment " if multi_env else "")
                  + ("| first mismatch or error " if name == "fail" else "| expected failure ") + "| rerun |",
                  "|---|---" + ("|---" if multi_env else "") + "|---|---|"]
        section = _fit(header, rows, ["", "</details>"], budget - _size(text + "\n".join(tail)))
        text += "\n".join(section)
    matrices = ["", "<details><summary>Layout x capture per impl and mode</summary>", ""]
    for impl in sorted(frame["impl"].unique()):
        for env_label in dict.fromkeys(frame["env"]):
            for mode in ordered(frame["mode"], "mode"):
                grid = matrix_markdown(frame, impl, mode, env_label)
                if grid:
                    matrices += [f"**{impl} · {mode}" + (f" · {env_label}" if multi_env else "") + "**", "", grid, ""]
    matrices += ["</details>"]
    block = "\n".join(matrices)
    if _size(text + block + "\n".join(tail)) <= budget:
        text += block
    return text + "\n".join(tail)


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


def _size(text: str) -> int:
    return len(text.encode("utf-8"))
