"""report.html: a run model in colour, one self-contained file (inline CSS and script, no
network).  Each matrix cell (one layout x capture of one impl and mode) holds a small grid with a
square per case (a column per program, grouped by nesting; rows: interleave); every listed square (unexpected failure,
stale, known failure) links to the case's details further down: its verdict note, expectation,
error with the tail of its traceback, mismatches and a command that reruns it alone.  Everything
shown comes from `model.RunModel`; nothing is decided here.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from .frame import STATUSES, anchor, mismatches, record_verdict, repro_command, status, text
from .model import (
    Attention,
    CaseNote,
    Matrix,
    RunModel,
    SkipGroup,
    expectation_text,
    traceback_tail,
    verdict_line,
)

MAX_HTML_MISMATCH_ROWS = 50  # per unexpected failure; the jsonl keeps all of them
MAX_HTML_XFAIL_ROWS = 12  # known failures are many and read alike

STATUS_TEXT = {
    "pass": "every oracle held",
    "rounding": "module mode: no random number differs, gradients or outputs differ by rounding only",
    "mismatch": "an oracle failed, not in the expectations file",
    "error": "the implementation raised",
    "crash": "the process running the case died",
    "timeout": "the case ran past its time limit",
    "stale": "listed as failing in the expectations file, but passed",
    "xfail": "failed, as the expectations file says (known failure)",
    "unsupported": "the implementation declared it cannot run this case",
    "skipped": "this environment cannot run it",
}

CSS = """
:root { --pass:#2da44e; --rounding:#57ab5a; --mismatch:#cf222e; --error:#8250df; --crash:#82071e;
  --timeout:#953800; --stale:#fb8500; --xfail:#d4a72c; --unsupported:#8c959f; --skipped:#d0d7de;
  --ink:#1f2328; --muted:#656d76; --line:#d0d7de; --bg-pass:#dafbe1; --bg-rounding:#eaf5ea;
  --bg-mismatch:#ffebe9; --bg-error:#fbefff; --bg-crash:#ffd8d3; --bg-timeout:#fff1e5; --bg-stale:#fff1e0;
  --bg-xfail:#fff8c5; --bg-unsupported:#f6f8fa; --bg-skipped:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--ink);
  margin: 0 auto; padding: 20px 28px 80px; max-width: 1500px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 19px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; margin-top: 32px; } h3 { font-size: 16px; margin: 22px 0 8px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: #f6f8fa; padding: 8px 10px; border-radius: 6px; overflow-x: auto; white-space: pre-wrap; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
nav { margin: 8px 0 0; color: var(--muted); } nav a { margin-right: 14px; }
.totals { font-size: 15px; margin: 4px 0; }
table { border-collapse: collapse; }
table.plain td, table.plain th { border: 1px solid var(--line); padding: 4px 10px; text-align: left; }
table.plain th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.zero { color: #c4c9cf; text-align: right; }
.api-yes { color: #1a7f37; font-weight: 600; } .api-no { color: var(--muted); } .api-unknown { color: #9a6700; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; margin: 10px 0 6px; }
.legend span.item { display: inline-flex; align-items: center; gap: 6px; }
.sq { display: inline-block; width: 15px; height: 15px; border-radius: 3px; border: 1px solid rgba(0,0,0,.15); }
a.sq:hover { outline: 2px solid var(--ink); outline-offset: 1px; }
.s-pass { background: var(--pass); } .s-mismatch { background: var(--mismatch); } .s-error { background: var(--error); }
.s-crash { background: var(--crash); } .s-timeout { background: var(--timeout); }
.s-stale { background: repeating-linear-gradient(45deg, var(--stale) 0 3px, #ffd08a 3px 6px); border-color: #bc4c00; }
.s-xfail { background: var(--xfail); } .s-unsupported { background: var(--unsupported); }
.s-skipped { background: var(--skipped); } .s-none { background: #fff; border: 1px dashed #c4c9cf; }
.impl { margin: 18px 0 26px; } .impl h3 { margin-bottom: 4px; } .impl .sub { color: var(--muted); margin: 0 0 8px; }
.modes { display: flex; flex-wrap: wrap; gap: 26px; }
table.matrix th { font-weight: 600; padding: 4px 8px; color: var(--muted); font-size: 12.5px; }
table.matrix th.row { text-align: right; } table.matrix th.corner { font-weight: 400; font-size: 11.5px; }
table.matrix caption { text-align: left; font-weight: 600; padding: 0 0 4px; }
table.matrix td { border: 1px solid var(--line); padding: 6px 8px; vertical-align: top; min-width: 118px; }
td.c-pass { background: var(--bg-pass); } td.c-mismatch { background: var(--bg-mismatch); }
td.c-error { background: var(--bg-error); } td.c-crash { background: var(--bg-crash); }
td.c-timeout { background: var(--bg-timeout); }
td.c-stale { background: var(--bg-stale); box-shadow: inset 0 0 0 2px var(--stale); }
td.c-xfail { background: var(--bg-xfail); } td.c-unsupported, td.c-skipped { background: var(--bg-skipped); }
td.c-empty { background: #fff; }
.cell { display: flex; align-items: center; gap: 8px; }
.grid { display: grid; grid-auto-flow: column; grid-auto-columns: 15px; gap: 3px; }
.count { font-size: 12px; color: var(--ink); white-space: nowrap; }
.box { border-radius: 6px; padding: 10px 14px; margin: 12px 0; border: 1px solid; }
.box h3 { margin: 0 0 6px; } .box ul { margin: 4px 0; padding-left: 20px; }
details.group { margin: 4px 0; } details.group > summary { cursor: pointer; }
.box.fail { background: var(--bg-mismatch); border-color: var(--mismatch); }
.box.stale { background: var(--bg-stale); border: 2px solid var(--stale); }
.box.warn { background: var(--bg-xfail); border-color: var(--xfail); }
.box.ok { background: var(--bg-pass); border-color: var(--pass); }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; color: #fff; font-size: 12px; font-weight: 600; }
.badge.s-xfail, .badge.s-skipped { color: var(--ink); } .badge.s-stale { color: #3d1d00; }
details.case { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.case > summary { padding: 6px 10px; cursor: pointer; }
details.case > div { padding: 2px 12px 10px; }
details.case.fail { border-left: 4px solid var(--mismatch); }
details.case.stale { border-left: 4px solid var(--stale); }
details.case.xfail { border-left: 4px solid var(--xfail); }
details.case:target, details.case.hit { box-shadow: 0 0 0 3px #54aeff; }
table.mm td, table.mm th { border: 1px solid var(--line); padding: 3px 8px; text-align: left; font-size: 12.5px; }
table.mm th { background: #f6f8fa; }
.cmd { background: #f6f8fa; padding: 3px 6px; border-radius: 4px; user-select: all; }
.muted { color: var(--muted); }
.banner {
  background: var(--bg-mismatch); border: 2px solid var(--mismatch); border-radius: 6px;
  padding: 8px 14px; margin: 10px 0; font-size: 15px;
}
.box.skip { background: var(--bg-unsupported); border-color: var(--unsupported); }
.box.interrupted { background: var(--bg-mismatch); border: 2px solid var(--mismatch); }
.sq.v-fail { outline: 2px solid var(--mismatch); outline-offset: 1px; }
.note { font-weight: 600; }
pre.tb { max-height: 26em; overflow-y: auto; }
.envname {
  font-weight: 600; margin: 12px 0 2px; padding: 2px 8px; background: #f6f8fa; border-left: 3px solid #8c959f;
  display: inline-block;
}
"""

SCRIPT = """
function openTarget() {
  var id = decodeURIComponent(location.hash.slice(1)); if (!id) return;
  var el = document.getElementById(id); if (!el) return;
  if (el.tagName === 'DETAILS') { el.open = true; el.classList.add('hit'); }
  el.scrollIntoView();
}
window.addEventListener('hashchange', openTarget); window.addEventListener('load', openTarget);
function setAll(cls, open) {
  document.querySelectorAll('details.case.' + cls).forEach(function (d) { d.open = open; });
}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_html(model: RunModel, *, generated: str = "") -> str:
    """The whole page of `model` as a string: the interrupted banner, header, environment(s), what
    needs attention, legend, counts, per impl one matrix per mode (per environment where there are
    several), then the details of every listed case."""
    banner = (f'<div class="banner"><b>⚠ The run was interrupted</b> ({_e(model.interrupted)}): this '
              "report holds only the cases that finished.</div>") if model.interrupted else ""
    totals = " · ".join(f"<b>{_e(t.text)}</b>" if t.loud else _e(t.text) for t in model.totals)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Checkpoint RNG harness report</title>", f"<style>{CSS}</style></head><body>",
        "<header><h1>Checkpoint RNG harness report</h1>", banner,
        f'<p class="totals">{totals}</p>',
        f'<p class="muted">{_e(generated)}</p>' if generated else "",
        '<nav><a href="#environment">Environment</a><a href="#attention">Needs attention</a>'
        '<a href="#counts">Counts</a><a href="#matrices">Matrices</a><a href="#cases">Failing cases</a></nav>',
        "</header>",
        _environment_section(model),
        _attention_section(model.attention),
        _counts_section(model),
        _matrices_section(model),
        _cases_section(model),
        f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _environment_section(model: RunModel) -> str:
    envs = model.environments
    head = "".join(f"<th>{_e(label)}</th>" for label in envs) if len(envs) > 1 else "<th>value</th>"
    rows = [f"<tr><th>{_e(f)}</th>" + "".join(f"<td>{_e(env.get(f, ''))}</td>" for env in envs.values()) + "</tr>"
            for f in model.env_fields]
    for name in model.api_names:
        cells = []
        for label in envs:
            value = model.apis[label].get(name, "not recorded")
            kind = "yes" if value == "yes" else "no" if value.startswith("no ") or value == "no" else "unknown"
            cells.append(f'<td class="api-{kind}">{_e(value)}</td>')
        rows.append(f"<tr><th>RNG API: <code>{_e(name)}</code></th>{''.join(cells)}</tr>")
    title = "Environments" if len(envs) > 1 else "Environment"
    return (f'<section id="environment"><h2>{title}</h2><table class="plain"><tr><th></th>{head}</tr>'
            + "".join(rows) + "</table></section>")


def _attention_section(attention: Attention) -> str:
    out = ['<section id="attention"><h2>Needs attention</h2>']
    if attention.interrupted:
        out.append(f'<div class="box interrupted"><h3>⚠ Interrupted</h3><div>The run was interrupted '
                   f"({_e(attention.interrupted)}): the cases that did not finish are in no table "
                   "below.</div></div>")
    if attention.failures:
        out.append(f'<div class="box fail"><h3>Unexpected failures: {len(attention.failures)}</h3>'
                   "<div>Not as the expectations file says: a bug in the implementation, a known "
                   "limitation to record there, or a known failure that failed differently.</div>"
                   + _folded_lists(attention.failures, lambda c: f"{_badge(status(c.record))} "
                                   f'<span class="mono">{_e(c.note)}</span>') + "</div>")
    if attention.stale:
        out.append(f'<div class="box stale"><h3>⚠ Stale expectations: {len(attention.stale)}</h3>'
                   "<div>The expectations file says these cases fail, but they <b>passed</b>: fix or narrow "
                   "the entries in <code>cases/expectations.toml</code>.</div>"
                   + _folded_lists(attention.stale, lambda c: f"<i>{_e(c.note)}</i>") + "</div>")
    if attention.problems:
        items = "".join(f"<li><code>{_e(line)}</code></li>" for line in attention.problems)
        out.append(f'<div class="box warn"><h3>⚠ Expectation problems: {len(attention.problems)}</h3>'
                   "<div>Entries of the expectations file that can never apply (their cases match no "
                   f"case, or their impl names no implementation):</div><ul>{items}</ul></div>")
    if attention.skips:
        count = sum(g.count for g in attention.skips)
        items = "".join(_skip_item(g) for g in attention.skips)
        out.append(f'<div class="box skip"><h3>Unsupported or skipped: {count} case{"s" * (count != 1)}</h3>'
                   "<div>Cases an implementation declared it cannot run, or this environment cannot run, "
                   f"with their reasons (cases per reason):</div><ul>{items}</ul></div>")
    if attention.nothing:
        out.append('<div class="box ok">Nothing: every case passed, or failed as the expectations file '
                   "says.</div>")
    return "".join(out) + "</section>"


def _skip_item(group: SkipGroup) -> str:
    where = f" on {_e(group.env)}" if group.env else ""
    head = f"<li><b>{_e(group.impl)}</b>{where}: {group.count} {_badge(group.outcome)}"
    if len(group.reasons) == 1:
        reason, n = group.reasons[0]
        return f'{head} — <span class="mono">{_e(reason)}</span> ({n})</li>'
    reasons = "".join(f'<li><span class="mono">{_e(reason)}</span> ({n})</li>' for reason, n in group.reasons)
    return f"{head}<ul>{reasons}</ul></li>"


def _folded_lists(cases: Sequence[CaseNote], what: Any, open_up_to: int = 8) -> str:
    """One folded list per impl (and environment): '<impl>: N cases', open when short."""
    groups: dict[tuple[str, str], list[CaseNote]] = {}
    for case in cases:
        groups.setdefault((str(case.record["impl"]), case.env), []).append(case)
    out = []
    for (impl, env_label), subset in groups.items():
        where = f" on {_e(env_label)}" if env_label else ""
        items = "".join(f'<li><a href="#{anchor(c.record)}"><code>{_e(c.record["case_id"])}</code></a> {what(c)}</li>'
                        for c in subset)
        opened = " open" if len(subset) <= open_up_to else ""
        out.append(f'<details class="group"{opened}><summary><b>{_e(impl)}</b>{where}: {len(subset)} '
                   f"case{'s' * (len(subset) != 1)}</summary><ul>{items}</ul></details>")
    return "".join(out)


def _badge(name: str) -> str:
    return f'<span class="badge s-{_e(name)}">{_e(name)}</span>'


def _legend(model: RunModel) -> str:
    items = "".join(f'<span class="item" title="{_e(STATUS_TEXT[s])}"><span class="sq s-{s}"></span>{s}</span>'
                    for s in STATUSES)
    items += '<span class="item"><span class="sq s-none"></span>no such case</span>'
    items += ('<span class="item"><span class="sq s-unsupported v-fail"></span>red outline: '
              "unexpected failure (e.g. unsupported where support is required)</span>")
    key = (f'<div class="muted">In each matrix cell: one square per case, one column per program, the columns '
           f'grouped by nesting ({_e(" / ".join(n or "spec" for n in model.nestings))}), each column\'s squares the '
           f'interleave values top to bottom ({_e(" / ".join(model.interleaves))}); an empty square: no such case. '
           "Failing squares link to the case's details; hover a square for its id.</div>")
    return f'<div class="legend">{items}</div>{key}'


def _counts_section(model: RunModel) -> str:
    frame = model.counts
    keys = [c for c in ("impl", "env") if c in frame.columns]
    names = [c for c in frame.columns if c not in keys]

    def head_cell(name: str) -> str:
        if name in STATUSES:
            return f'<th><span class="sq s-{_e(name)}"></span> {_e(name)}</th>'
        return f"<th>{_e(name)}</th>"

    verdict_class = {"unexpected fail": "mismatch", "known (xfail)": "xfail", "stale": "stale"}
    head = ("<tr><th>impl</th>" + ("<th>environment</th>" if "env" in keys else "")
            + "".join(head_cell(n) for n in names) + "</tr>")
    rows = []
    for row in frame.to_dict("records"):
        cells = []
        for name in names:
            n = int(row[name])
            colour = name if name in STATUSES else verdict_class.get(name, "")
            if name == "total":
                cells.append(f'<td class="num">{n}</td>')
            elif n:
                cells.append(f'<td class="num c-{_e(colour)}">{n}</td>')
            else:
                cells.append('<td class="zero">·</td>')
        env_cell = f"<td>{_e(row['env'])}</td>" if "env" in keys else ""
        rows.append(f'<tr><td><a href="#{_impl_id(row["impl"])}">{_e(row["impl"])}</a></td>{env_cell}'
                    f'{"".join(cells)}</tr>')
    return (f'<section id="counts"><h2>Counts per implementation</h2>{_legend(model)}'
            '<p class="muted">Outcomes as run, then verdicts: <i>unexpected fail</i> (not as the expectations '
            "file says), <i>known (xfail)</i>, <i>stale</i> (expected to fail, passed).</p>"
            f'<table class="plain">{head}{"".join(rows)}</table></section>')


def _impl_id(impl: str) -> str:
    return "impl-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in impl)


def _matrices_section(model: RunModel) -> str:
    out = ['<section id="matrices"><h2>Layout × capture, per implementation and mode</h2>']
    by_impl: dict[str, list[Matrix]] = {}
    for matrix in model.matrices:
        by_impl.setdefault(matrix.impl, []).append(matrix)
    for impl, matrices in by_impl.items():
        summary = " · ".join(f"{n} {s}" for s, n in model.impl_statuses.get(impl, {}).items())
        out.append(f'<div class="impl" id="{_impl_id(impl)}"><h3>{_e(impl)}</h3><p class="sub">{_e(summary)}</p>')
        by_env: dict[str, list[Matrix]] = {}
        for matrix in matrices:
            by_env.setdefault(matrix.env, []).append(matrix)
        for env_label, in_env in by_env.items():
            if env_label:
                out.append(f'<div class="envname">{_e(env_label)}</div>')
            out.append('<div class="modes">' + "".join(_matrix(m) for m in in_env) + "</div>")
        out.append("</div>")
    return "".join(out) + "</section>"


def _matrix(matrix: Matrix) -> str:
    head = ('<tr><th class="row corner">layout \\ capture</th>'
            + "".join(f"<th>{_e(c)}</th>" for c in matrix.captures) + "</tr>")
    rows = []
    for layout in matrix.layouts:
        tds = []
        for capture in matrix.captures:
            cell = matrix.cells.get((layout, capture))
            if cell is None:
                tds.append('<td class="c-empty"></td>')
                continue
            grid = (f'<div class="grid" style="grid-template-rows: repeat({len(matrix.interleaves)}, 15px)">'
                    + "".join(_square(s) for s in cell.squares) + "</div>")
            tds.append(f'<td class="c-{cell.worst}"><div class="cell">{grid}'
                       f'<div class="count">{_e(_count_text(cell.statuses))}</div></div></td>')
        rows.append(f'<tr><th class="row">{_e(layout)}</th>{"".join(tds)}</tr>')
    return f'<table class="matrix"><caption>{_e(matrix.mode)}</caption>{head}{"".join(rows)}</table>'


def _square(square: Any) -> str:
    if square.record is None:
        return '<span class="sq s-none" title="no such case"></span>'
    classes = f"sq s-{_e(square.status)}" + (" v-fail" if square.failed else "")
    if square.linked:
        return f'<a class="{classes}" href="#{anchor(square.record)}" title="{_e(square.tip)}"></a>'
    return f'<span class="{classes}" title="{_e(square.tip)}"></span>'


def _count_text(statuses: list[str]) -> str:
    if statuses and all(s == statuses[0] for s in statuses):
        return f"{statuses[0]} {len(statuses)}"
    return " · ".join(f"{s} {statuses.count(s)}" for s in STATUSES if s in statuses)


def _cases_section(model: RunModel) -> str:
    cases = model.failing_cases()
    xfails = len(model.failing.get("xfail", ()))
    buttons = (' Known failures (xfail): <button type="button" onclick="setAll(\'xfail\', true)">expand all</button> '
               '<button type="button" onclick="setAll(\'xfail\', false)">collapse all</button>') if xfails else ""
    out = [f'<section id="cases"><h2>Failing cases: {len(cases)}</h2>'
           '<p class="muted">Unexpected failures and stale expectations first (open), then known failures '
           f"(folded).{buttons}</p>"]
    if not cases:
        out.append("<p>None.</p>")
    out += [_case_details(case) for case in cases]
    return "".join(out) + "</section>"


def _case_details(case: CaseNote) -> str:
    record = case.record
    verdict_name = record_verdict(record)
    name = status(record)
    where = f' <span class="muted">{_e(case.env)}</span>' if case.env else ""
    summary = (f"<summary>{_badge(name)} <b>{_e(record['impl'])}</b> <code>{_e(record['case_id'])}</code>{where}"
               f' <span class="muted">{_e(case.note)}</span></summary>')
    body = []
    if verdict_line(record):
        body.append(f'<p class="note">Verdict: {_e(verdict_line(record))}</p>')
    expected = expectation_text(record, full=True)
    if expected:
        issue = text(record, "expected_issue")
        issue_html = (f' (<a href="{_e(issue)}" rel="noreferrer">{_e(issue)}</a>)'
                      if issue.startswith(("http://", "https://"))
                      else (f" ({_e(issue)})" if issue else ""))
        body.append(f"<p>Expected to fail: <i>{_e(expected)}</i>{issue_html}</p>")
    if verdict_name == "stale":
        body.append("<p><b>It passed: the expectation is stale.</b></p>")
    if text(record, "error"):
        body.append(f"<pre>{_e(text(record, 'error').rstrip())}</pre>")
    tail, count = traceback_tail(record)
    if tail and record.get("outcome") in ("error", "crash"):
        shown = tail.count("\n") + 1
        label = f"Traceback (last {shown} of {count} lines)" if shown < count else "Traceback"
        body.append(f'<p class="muted">{label}:</p><pre class="tb">{_e(tail)}</pre>')
    if text(record, "first_divergent_draw"):
        body.append(f"<p>First divergent draw: <code>{_e(record['first_divergent_draw'])}</code></p>")
    if text(record, "diagnosis"):
        body.append(f"<p>Diagnosis: {_e(record['diagnosis'])}</p>")
    if text(record, "checkpointed"):
        body.append(f'<p class="muted">Checkpointed: {_e(record["checkpointed"])}; '
                    f'{_e(record.get("draws_per_forward"))} '
                    f"RNG draws per forward at {_e(record.get('draw_sites'))} sites</p>")
    if text(record, "transformers"):
        api = text(record, "checkpointing_api")
        body.append(f'<p class="muted">transformers {_e(record["transformers"])}'
                    + (f"; its checkpointing on through <code>{_e(api)}</code>" if api else "") + "</p>")
    if text(record, "reason") and name not in ("mismatch", "xfail"):
        body.append(f"<p>Reason: {_e(record['reason'])}</p>")
    body.append(_mismatch_table(record, verdict_name))
    body.append(f'<p>Rerun alone: <code class="cmd">{_e(repro_command(record))}</code></p>')
    opened = " open" if verdict_name in ("fail", "stale") else ""
    kind = verdict_name if verdict_name in ("fail", "stale", "xfail") else "fail"
    return (f'<details class="case {kind}" id="{anchor(record)}"{opened}>{summary}<div>{"".join(body)}'
            '<p><a href="#matrices">back to the matrices</a></p></div></details>')


def _mismatch_table(record: Mapping[str, Any], verdict_name: str) -> str:
    found = mismatches(record)
    if not found:
        return ""
    limit = MAX_HTML_XFAIL_ROWS if verdict_name == "xfail" else MAX_HTML_MISMATCH_ROWS
    shown = found[:limit]
    with_detail = any(m.detail for m in shown)
    rows = "".join(
        f"<tr><td>{_e(m.oracle)}</td><td>{_e(m.subject)}</td><td>{_e(m.iteration)}</td>"
        f"<td class=\"num\">{_e(m.count)} / {_e(m.total)}"
        f"{f' ({100.0 * m.count / m.total:.1f}%)' if m.total else ''}</td>"
        f"<td class=\"mono\">{_e('' if m.first_index is None else m.first_index)}</td>"
        f"<td class=\"mono\">{_e(m.got)}</td><td class=\"mono\">{_e(m.expected)}</td>"
        + (f"<td>{_e(m.detail)}</td>" if with_detail else "") + "</tr>"
        for m in shown)
    more = (f'<p class="muted">... {len(found) - limit} more in results.jsonl</p>'
            if len(found) > limit else "")
    return ('<table class="mm"><tr><th>oracle</th><th>site / stream / tensor</th><th>iteration</th>'
            "<th>mismatched elements</th><th>first index</th><th>got</th><th>expected</th>"
            + ("<th>detail</th>" if with_detail else "") + f"</tr>{rows}</table>{more}")
