"""report.html: the run's matrices in colour, one self-contained file (inline CSS and script, no
network).  Each matrix cell (one layout x capture of one impl and mode) holds a small grid with a
square per case (columns: nesting, rows: interleave); every failing square links to the case's
details further down: its mismatches, expectation and a command that reruns it alone.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from .report_env import RNG_APIS, env_key, rng_apis
from .report_frame import (
    DETAILED,
    STATUSES,
    anchor,
    case_sort_key,
    environments,
    labels_of,
    mismatches,
    ordered,
    record_verdict,
    repro_command,
    status,
)
from .report_markdown import ENV_FIELDS, totals_line

MAX_HTML_MISMATCH_ROWS = 50  # per unexpected failure; the jsonl keeps all of them
MAX_HTML_XFAIL_ROWS = 12  # known failures are many and read alike

STATUS_TEXT = {
    "pass": "every oracle held",
    "mismatch": "an oracle failed, not in the expectations file",
    "error": "the implementation raised",
    "crash": "the process running the case died",
    "timeout": "the case ran past its time limit",
    "stale": "listed as failing in the expectations file, but passed",
    "xfail": "failed, as the expectations file says (known failure)",
    "unsupported": "the implementation declared it cannot run this case",
    "skipped": "this environment cannot run it",
}
# Worst first: the colour a matrix cell takes.
SEVERITY = ("crash", "timeout", "error", "mismatch", "stale", "xfail", "pass", "unsupported", "skipped")

CSS = """
:root { --pass:#2da44e; --mismatch:#cf222e; --error:#8250df; --crash:#82071e; --timeout:#953800;
  --stale:#fb8500; --xfail:#d4a72c; --unsupported:#8c959f; --skipped:#d0d7de; --ink:#1f2328; --muted:#656d76;
  --line:#d0d7de; --bg-pass:#dafbe1; --bg-mismatch:#ffebe9; --bg-error:#fbefff; --bg-crash:#ffd8d3;
  --bg-timeout:#fff1e5; --bg-stale:#fff1e0; --bg-xfail:#fff8c5; --bg-unsupported:#f6f8fa; --bg-skipped:#f6f8fa; }
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
td.c-timeout { background: var(--bg-timeout); } td.c-stale { background: var(--bg-stale); box-shadow: inset 0 0 0 2px var(--stale); }
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
details.case.fail { border-left: 4px solid var(--mismatch); } details.case.stale { border-left: 4px solid var(--stale); }
details.case.xfail { border-left: 4px solid var(--xfail); }
details.case:target, details.case.hit { box-shadow: 0 0 0 3px #54aeff; }
table.mm td, table.mm th { border: 1px solid var(--line); padding: 3px 8px; text-align: left; font-size: 12.5px; }
table.mm th { background: #f6f8fa; }
.cmd { background: #f6f8fa; padding: 3px 6px; border-radius: 4px; user-select: all; }
.muted { color: var(--muted); }
.envname { font-weight: 600; margin: 12px 0 2px; padding: 2px 8px; background: #f6f8fa; border-left: 3px solid #8c959f; display: inline-block; }
"""

SCRIPT = """
function openTarget() {
  var id = decodeURIComponent(location.hash.slice(1)); if (!id) return;
  var el = document.getElementById(id); if (!el) return;
  if (el.tagName === 'DETAILS') { el.open = true; el.classList.add('hit'); }
  el.scrollIntoView();
}
window.addEventListener('hashchange', openTarget); window.addEventListener('load', openTarget);
function setAll(cls, open) { document.querySelectorAll('details.case.' + cls).forEach(function (d) { d.open = open; }); }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_html(records: Sequence[Mapping[str, Any]], *, unmatched: Sequence[str] | None = None,
                generated: str = "") -> str:
    """The whole page as a string: header, environment(s), what needs attention, legend, counts,
    per impl one matrix per mode (per environment where there are several), failing case details."""
    records = list(records)
    labels = labels_of(records)
    multi_env = len(labels) > 1
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Checkpoint RNG harness report</title>", f"<style>{CSS}</style></head><body>",
        "<header><h1>Checkpoint RNG harness report</h1>",
        f'<p class="totals">{_md_bold(totals_line(records))}</p>',
        f'<p class="muted">{_e(generated)}</p>' if generated else "",
        '<nav><a href="#environment">Environment</a><a href="#attention">Needs attention</a>'
        '<a href="#counts">Counts</a><a href="#matrices">Matrices</a><a href="#cases">Failing cases</a></nav>',
        "</header>",
        _environment_section(records),
        _attention_section(records, unmatched, labels, multi_env),
        _counts_section(records, labels, multi_env),
        _matrices_section(records, labels, multi_env),
        _cases_section(records, labels, multi_env),
        f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _md_bold(text: str) -> str:
    pieces = _e(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(pieces))


def _environment_section(records: Sequence[Mapping[str, Any]]) -> str:
    envs = environments(records)
    fields = [f for f in ENV_FIELDS if any(f in env for env in envs.values())]
    fields += sorted({k for env in envs.values() for k in env} - set(ENV_FIELDS) - {"rng_apis", "gpu_name", "gpu_count"})
    head = "".join(f"<th>{_e(label)}</th>" for label in envs) if len(envs) > 1 else "<th>value</th>"
    rows = [f"<tr><th>{_e(f)}</th>" + "".join(f"<td>{_e(env.get(f, ''))}</td>" for env in envs.values()) + "</tr>"
            for f in fields]
    apis = {label: rng_apis(env) for label, env in envs.items()}
    names = list(RNG_APIS) + sorted({n for a in apis.values() for n in a} - set(RNG_APIS))
    for name in names:
        cells = []
        for label in envs:
            value = apis[label].get(name, "not recorded")
            kind = "yes" if value == "yes" else "no" if value.startswith("no ") or value == "no" else "unknown"
            cells.append(f'<td class="api-{kind}">{_e(value)}</td>')
        rows.append(f"<tr><th>RNG API: <code>{_e(name)}</code></th>{''.join(cells)}</tr>")
    title = "Environments" if len(envs) > 1 else "Environment"
    return (f'<section id="environment"><h2>{title}</h2><table class="plain"><tr><th></th>{head}</tr>'
            + "".join(rows) + "</table></section>")


def _case_link(record: Mapping[str, Any], labels: Mapping[str, str], multi_env: bool) -> str:
    where = f" <span class=\"muted\">({_e(labels[env_key(record.get('env'))])})</span>" if multi_env else ""
    return f'<a href="#{anchor(record)}"><b>{_e(record["impl"])}</b> <code>{_e(record["case_id"])}</code></a>{where}'


def _attention_section(records: Sequence[Mapping[str, Any]], unmatched: Sequence[str] | None,
                       labels: Mapping[str, str], multi_env: bool) -> str:
    failed = sorted((r for r in records if record_verdict(r) == "fail"), key=case_sort_key)
    stale = sorted((r for r in records if record_verdict(r) == "stale"), key=case_sort_key)
    out = ['<section id="attention"><h2>Needs attention</h2>']
    if failed:
        out.append(f'<div class="box fail"><h3>Unexpected failures: {len(failed)}</h3>'
                   "<div>Not in the expectations file: a bug in the implementation, or a known limitation "
                   "to record there.</div>"
                   + _folded_lists(failed, labels, multi_env, lambda r: f"{_badge(status(r))} "
                                   f'<span class="mono">{_e(_what(r))}</span>') + "</div>")
    if stale:
        out.append(f'<div class="box stale"><h3>⚠ Stale expectations: {len(stale)}</h3>'
                   "<div>The expectations file says these cases fail, but they <b>passed</b>: fix or narrow "
                   "the entries in <code>cases/expectations.toml</code>.</div>"
                   + _folded_lists(stale, labels, multi_env, lambda r: "expected to fail (<i>"
                                   f"{_e(_first_line(r.get('expected_failure', '')))}</i>) but passed") + "</div>")
    if unmatched:
        items = "".join(f"<li><code>{_e(entry)}</code></li>" for entry in unmatched)
        out.append(f'<div class="box warn"><h3>⚠ Expectation entries that match no case: {len(unmatched)}</h3>'
                   f"<ul>{items}</ul></div>")
    if not (failed or stale or unmatched):
        out.append('<div class="box ok">Nothing: every case passed, was skipped, or failed as the '
                   "expectations file says.</div>")
    return "".join(out) + "</section>"


def _folded_lists(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], multi_env: bool,
                  what: Any, open_up_to: int = 8) -> str:
    """One folded list per impl (and environment): '<impl>: N cases', open when short."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((str(r["impl"]), labels[env_key(r.get("env"))] if multi_env else ""), []).append(r)
    out = []
    for (impl, env_label), subset in groups.items():
        where = f" on {_e(env_label)}" if env_label else ""
        items = "".join(f'<li><a href="#{anchor(r)}"><code>{_e(r["case_id"])}</code></a> {what(r)}</li>'
                        for r in subset)
        opened = " open" if len(subset) <= open_up_to else ""
        out.append(f'<details class="group"{opened}><summary><b>{_e(impl)}</b>{where}: {len(subset)} '
                   f"case{'s' * (len(subset) != 1)}</summary><ul>{items}</ul></details>")
    return "".join(out)


def _first_line(text: Any) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _what(record: Mapping[str, Any]) -> str:
    found = mismatches(record)
    if found:
        return found[0].message() + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
    return _first_line(record.get("error", "")) or _first_line(record.get("reason", ""))


def _badge(name: str) -> str:
    return f'<span class="badge s-{_e(name)}">{_e(name)}</span>'


def _legend(records: Sequence[Mapping[str, Any]]) -> str:
    items = "".join(f'<span class="item" title="{_e(STATUS_TEXT[s])}"><span class="sq s-{s}"></span>{s}</span>'
                    for s in STATUSES)
    items += '<span class="item"><span class="sq s-none"></span>no such case</span>'
    nesting = ordered((r.get("nesting", "") for r in records), "nesting")
    interleave = ordered((r.get("interleave", "") for r in records), "interleave")
    key = (f'<div class="muted">In each matrix cell: one square per case, columns {_e(" / ".join(nesting))} '
           f'(nesting), rows {_e(" / ".join(interleave))} (interleave). Failing squares link to the '
           "case's details; hover a square for its id.</div>")
    return f'<div class="legend">{items}</div>{key}'


def _counts_section(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], multi_env: bool) -> str:
    groups: dict[tuple[str, str], list[str]] = {}
    for r in records:
        groups.setdefault((str(r["impl"]), labels[env_key(r.get("env"))] if multi_env else ""), []).append(status(r))
    present = [s for s in STATUSES if any(s in v for v in groups.values())]
    head = "<tr><th>impl</th>" + ("<th>environment</th>" if multi_env else "") + "".join(
        f'<th><span class="sq s-{s}"></span> {s}</th>' for s in present) + "<th>total</th></tr>"
    rows = []
    for (impl, env_label), values in sorted(groups.items()):
        cells = []
        for s in present:
            n = values.count(s)
            cells.append(f'<td class="num c-{s}">{n}</td>' if n else '<td class="zero">·</td>')
        env_cell = f"<td>{_e(env_label)}</td>" if multi_env else ""
        rows.append(f'<tr><td><a href="#{_impl_id(impl)}">{_e(impl)}</a></td>{env_cell}{"".join(cells)}'
                    f'<td class="num">{len(values)}</td></tr>')
    return (f'<section id="counts"><h2>Counts per implementation</h2>{_legend(records)}'
            f'<table class="plain">{head}{"".join(rows)}</table></section>')


def _impl_id(impl: str) -> str:
    return "impl-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in impl)


def _matrices_section(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], multi_env: bool) -> str:
    out = ['<section id="matrices"><h2>Layout × capture, per implementation and mode</h2>']
    by_impl: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_impl.setdefault(str(r["impl"]), []).append(r)
    for impl in sorted(by_impl):
        subset = by_impl[impl]
        counts = {s: sum(1 for r in subset if status(r) == s) for s in STATUSES}
        summary = " · ".join(f"{n} {s}" for s, n in counts.items() if n)
        out.append(f'<div class="impl" id="{_impl_id(impl)}"><h3>{_e(impl)}</h3><p class="sub">{_e(summary)}</p>')
        for key, label in labels.items():
            in_env = [r for r in subset if env_key(r.get("env")) == key]
            if not in_env:
                continue
            if multi_env:
                out.append(f'<div class="envname">{_e(label)}</div>')
            out.append('<div class="modes">')
            for mode in ordered((r.get("mode", "") for r in in_env), "mode"):
                out.append(_matrix([r for r in in_env if r.get("mode") == mode], mode))
            out.append("</div>")
        out.append("</div>")
    return "".join(out) + "</section>"


def _matrix(records: Sequence[Mapping[str, Any]], mode: str) -> str:
    layouts = ordered((r.get("layout", "") for r in records), "layout")
    captures = ordered((r.get("capture", "") for r in records), "capture")
    nestings = ordered((r.get("nesting", "") for r in records), "nesting")
    interleaves = ordered((r.get("interleave", "") for r in records), "interleave")
    cells: dict[tuple[str, str], dict[tuple[str, str], list[Mapping[str, Any]]]] = {}
    for r in records:
        cell = cells.setdefault((r.get("layout", ""), r.get("capture", "")), {})
        cell.setdefault((r.get("nesting", ""), r.get("interleave", "")), []).append(r)
    head = ('<tr><th class="row corner">layout \\ capture</th>'
            + "".join(f"<th>{_e(c)}</th>" for c in captures) + "</tr>")
    rows = []
    for layout in layouts:
        tds = []
        for capture in captures:
            cell = cells.get((layout, capture))
            if not cell:
                tds.append('<td class="c-empty"></td>')
                continue
            squares, statuses = [], []
            for nesting in nestings:
                for interleave in interleaves:
                    for r in cell.get((nesting, interleave), []) or [None]:
                        squares.append(_square(r))
                        if r is not None:
                            statuses.append(status(r))
            worst = next((s for s in SEVERITY if s in statuses), "empty")
            grid = (f'<div class="grid" style="grid-template-rows: repeat({len(interleaves)}, 15px)">'
                    + "".join(squares) + "</div>")
            tds.append(f'<td class="c-{worst}"><div class="cell">{grid}'
                       f'<div class="count">{_e(_count_text(statuses))}</div></div></td>')
        rows.append(f'<tr><th class="row">{_e(layout)}</th>{"".join(tds)}</tr>')
    return f'<table class="matrix"><caption>{_e(mode)}</caption>{head}{"".join(rows)}</table>'


def _square(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return '<span class="sq s-none" title="no such case"></span>'
    name = status(record)
    tip = f"{record['case_id']}: {name}"
    what = _what(record) if name in DETAILED else ""
    if what:
        tip += f" ({what})"
    if name in DETAILED:
        return f'<a class="sq s-{_e(name)}" href="#{anchor(record)}" title="{_e(tip)}"></a>'
    return f'<span class="sq s-{_e(name)}" title="{_e(tip)}"></span>'


def _count_text(statuses: list[str]) -> str:
    if statuses and all(s == statuses[0] for s in statuses):
        return f"{statuses[0]} {len(statuses)}"
    return " · ".join(f"{s} {statuses.count(s)}" for s in STATUSES if s in statuses)


def _cases_section(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], multi_env: bool) -> str:
    failing = sorted((r for r in records if status(r) in DETAILED), key=case_sort_key)
    xfails = sum(1 for r in failing if record_verdict(r) == "xfail")
    buttons = (' Known failures (xfail): <button type="button" onclick="setAll(\'xfail\', true)">expand all</button> '
               '<button type="button" onclick="setAll(\'xfail\', false)">collapse all</button>') if xfails else ""
    out = [f'<section id="cases"><h2>Failing cases: {len(failing)}</h2>'
           '<p class="muted">Unexpected failures and stale expectations first (open), then known failures '
           f"(folded).{buttons}</p>"]
    if not failing:
        out.append("<p>None.</p>")
    for r in failing:
        out.append(_case_details(r, labels[env_key(r.get("env"))] if multi_env else ""))
    return "".join(out) + "</section>"


def _case_details(record: Mapping[str, Any], env_label: str) -> str:
    verdict_name = record_verdict(record)
    name = status(record)
    where = f' <span class="muted">{_e(env_label)}</span>' if env_label else ""
    summary = (f"<summary>{_badge(name)} <b>{_e(record['impl'])}</b> <code>{_e(record['case_id'])}</code>{where}"
               f' <span class="muted">{_e(_what(record))}</span></summary>')
    body = []
    if record.get("expected_failure"):
        issue = record.get("expected_issue") or ""
        issue_html = f' (<a href="{_e(issue)}" rel="noreferrer">{_e(issue)}</a>)' if issue.startswith(("http://", "https://")) \
            else (f" ({_e(issue)})" if issue else "")
        body.append(f"<p>Expected to fail: <i>{_e(record['expected_failure'])}</i>{issue_html}</p>")
    if verdict_name == "stale":
        body.append("<p><b>It passed: the expectation is stale.</b></p>")
    if record.get("error"):
        body.append(f"<pre>{_e(record['error'])}</pre>")
    if record.get("reason") and name not in ("mismatch", "xfail"):
        body.append(f"<p>Reason: {_e(record['reason'])}</p>")
    found = mismatches(record)
    if found:
        limit = MAX_HTML_XFAIL_ROWS if verdict_name == "xfail" else MAX_HTML_MISMATCH_ROWS
        shown = found[:limit]
        with_detail = any(m.detail for m in shown)
        rows = "".join(
            f"<tr><td>{_e(m.oracle)}</td><td>{_e(m.subject)}</td><td>{m.iteration}</td>"
            f"<td class=\"num\">{m.count} / {m.total}"
            f"{f' ({100.0 * m.count / m.total:.1f}%)' if m.total else ''}</td>"
            f"<td class=\"mono\">{_e('' if m.first_index is None else m.first_index)}</td>"
            f"<td class=\"mono\">{_e(m.got)}</td><td class=\"mono\">{_e(m.expected)}</td>"
            + (f"<td>{_e(m.detail)}</td>" if with_detail else "") + "</tr>"
            for m in shown)
        more = (f'<p class="muted">... {len(found) - limit} more in results.jsonl</p>'
                if len(found) > limit else "")
        body.append('<table class="mm"><tr><th>oracle</th><th>site / stream / tensor</th><th>iteration</th>'
                    "<th>mismatched elements</th><th>first index</th><th>got</th><th>expected</th>"
                    + ("<th>detail</th>" if with_detail else "") + f"</tr>{rows}</table>{more}")
    body.append(f'<p>Rerun alone: <code class="cmd">{_e(repro_command(record))}</code></p>')
    opened = " open" if verdict_name in ("fail", "stale") else ""
    kind = verdict_name if verdict_name in ("fail", "stale", "xfail") else "fail"
    return (f'<details class="case {kind}" id="{anchor(record)}"{opened}>{summary}<div>{"".join(body)}'
            '<p><a href="#matrices">back to the matrices</a></p></div></details>')
