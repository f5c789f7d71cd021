"""Results -> report directory: results.jsonl (the stable source), summary.md, report.html,
cases.csv and mismatches.csv.

The report never re-runs anything: it reads result records (the dicts of `CaseResult.to_dict` with
the verdict the run gave them, each carrying the environment it ran in).  `model.build` turns them,
once, into a `RunModel` (totals, counts, what needs attention, failing cases, matrices) that
`markdown` (summary.md, the GitHub step summary) and `html` (report.html) only render; `frame`
makes the pandas frames behind the CSVs.  `write` is the one entry point every run uses (the pytest
plugin's controller, ``python -m harness run``, ``report`` and ``merge``): it renders every file
before touching the directory, replaces the files atomically, moves the ``latest`` pointer and
appends a short summary to ``$GITHUB_STEP_SUMMARY`` when that is set.

Modules: `env` (the environment header), `frame` (records as DataFrames; statuses and verdicts),
`model` (the run model), `markdown`, `html`, `merge` (merge and compare reports), `cli` (the
``report``, ``merge`` and ``compare`` commands).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import UsageError
from ..results import AXES, FAILED_OUTCOMES, OUTCOMES, VERDICTS, CaseRecord, as_json
from . import html as html_view
from . import markdown as markdown_view
from .env import env_key
from .frame import (
    STATUSES,
    mismatches_frame,
    record_key,
    record_verdict,
    repro_command,
    results_frame,
    status,
    text,
    text_list,
    verdict,
)
from .markdown import MAX_MISMATCH_LINES, matrix_markdown
from .model import RunModel, build

__all__ = [
    "FAILED_OUTCOMES", "MAX_MISMATCH_LINES", "OUTCOMES", "REPORT_FILES", "STATUSES", "STEP_SUMMARY_LIMIT",
    "REPLACE_FLAG", "VERDICTS", "ReportError", "ReportWriteError", "RunModel", "append_step_summary", "build",
    "check_report_dir", "clear_report", "default_report_dir", "env_key", "junit_properties", "report_files_in",
    "write_output_file", "write_or_fallback",
    "matrix_markdown", "mismatches_frame", "record_key", "record_verdict", "render", "repro_command",
    "results_frame", "status", "step_summary_markdown", "summary_markdown", "verdict",
    "write",
]

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub refuses a step summary over 1 MiB
REPORT_FILES = ("summary.md", "report.html", "cases.csv", "mismatches.csv", "results.jsonl")


class ReportError(UsageError, OSError):
    """The report directory is unusable, or there is nothing to report; one line for the user."""


class ReportWriteError(ReportError):
    """A write into the report directory failed after the up-front checks (a full disk, the folder
    removed under the run): one line naming the file and the reason."""


def junit_properties(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The case's properties for pytest's ``--junitxml`` (via ``item.user_properties``): impl,
    case id, every axis, outcome, verdict and its note, reason or error, the expectation, the
    mismatches (count and one line each, the first 12) and the command that reruns the case alone.
    Names are prefixed ``harness.``; every value is a string."""
    props = [("harness.impl", str(record["impl"])), ("harness.case_id", str(record["case_id"]))]
    props += [(f"harness.{axis}", str(record[axis])) for axis in AXES if axis in record]
    props += [("harness.outcome", str(record.get("outcome", ""))),
              ("harness.verdict", record_verdict(record))]
    for name in ("verdict_note", "reason", "error", "expected_failure", "expected_outcome", "expected_issue"):
        if text(record, name):
            props.append((f"harness.{name}", text(record, name)))
    if text_list(record, "expected_oracles"):
        props.append(("harness.expected_oracles", ", ".join(text_list(record, "expected_oracles"))))
    found = record.get("mismatches") or []
    if found:
        from .frame import mismatches

        lines = [m.message() for m in mismatches(record)]
        props.append(("harness.mismatch_count", str(len(lines))))
        props += [(f"harness.mismatch.{i}", line) for i, line in enumerate(lines[:MAX_MISMATCH_LINES])]
    props.append(("harness.repro", repro_command(record)))
    return props


def default_report_dir(root: "str | Path" = "reports") -> Path:
    """reports/<timestamp>-<pid>: a new directory per run."""
    return Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


REPLACE_FLAG = "--replace-report"


def report_files_in(path: "str | Path") -> list[str]:
    """The report files (`REPORT_FILES`) that `path` holds now, in that order."""
    path = Path(path)
    return [name for name in REPORT_FILES if (path / name).is_file()] if path.is_dir() else []


def check_report_dir(path: "str | Path", *, replace: bool = False, flag: str = REPLACE_FLAG) -> None:
    """Raise ReportError when `path` cannot become a writable report directory, or already holds a
    report and `replace` is false (a new run would overwrite it: `flag` is how to ask for that).
    Checked before any case runs, by making it (and its parents) and writing a file there:
    permission bits alone do not tell (root under /proc, a read-only mount)."""
    path = Path(path)
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ReportError(f"report directory {path} is unusable: {existing} is not a directory")
    held = report_files_in(path)
    if held and not replace:
        raise ReportError(f"report directory {path} already holds a report ({', '.join(held)}): choose another "
                          f"directory, or pass {flag} to replace it")
    _try_writing(path, f"report directory {path}")


def clear_report(path: "str | Path") -> None:
    """Remove the report files `path` holds (a run that replaces a report, at its first record):
    the folder then never shows the old views beside the new run's results."""
    for name in report_files_in(path):
        try:
            (Path(path) / name).unlink()
        except OSError as exc:
            raise ReportWriteError(f"cannot replace the report in {path}: cannot remove {name}: "
                                   f"{exc.strerror or exc}") from None


def write_output_file(path: "str | Path", content: "str | bytes", what: str) -> None:
    """Write `content` (text, or bytes as they are) to the output file `path` (e.g. --script); a
    write that fails (a full disk, a device that refuses it) is a ReportWriteError naming `what`,
    the file and the reason, not a traceback."""
    try:
        if isinstance(content, bytes):
            Path(path).write_bytes(content)
        else:
            Path(path).write_text(content)
    except OSError as exc:
        raise ReportWriteError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def check_output_file(path: "str | Path", what: str) -> None:
    """Raise ReportError when `path` (an output file, e.g. --script) cannot be written: its folder
    is made and a file written there before the work that produces it starts."""
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{what} {path} is a directory, not a file")
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ReportError(f"{what} {path} is unusable: {existing} is not a directory")
    _try_writing(path.parent, f"{what} {path}")


def _try_writing(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".harness-write-check."):
            pass
    except OSError as exc:
        raise ReportError(f"{what} is unusable: cannot write in {folder}: {exc.strerror or exc}") from None


def summary_markdown(records: Sequence[dict[str, Any]], env: Mapping[str, Any] | None = None, *,
                     unmatched: Sequence[str] | None = None, interrupted: str | None = None) -> str:
    """summary.md of `records` (see `markdown.summary`): `env` fills in records that carry none,
    `unmatched` are the expectation-problem lines, `interrupted` a note for the banner."""
    records = [r if r.get("env") or env is None else {**r, "env": dict(env)} for r in records]
    return markdown_view.summary(build(records, problems=unmatched, interrupted=interrupted))


def step_summary_markdown(source: "RunModel | Sequence[dict[str, Any]]", report_dir: str, budget: int) -> str:
    """The GitHub step summary of a run model (or of records), at most `budget` bytes (UTF-8)."""
    model = source if isinstance(source, RunModel) else build(source)
    return markdown_view.step_summary(model, report_dir, budget)


def render(records: Sequence[dict[str, Any]], *, unmatched: Sequence[str] | None = None,
           interrupted: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Every report file as text, results.jsonl last: ({name: text}, {name: why it failed}).

    results.jsonl cannot fail; a view whose renderer raises (or whose model cannot be built) is
    left out and named, so a bug in a view never costs the results.
    """
    files, failed, _ = _render(records, unmatched, interrupted)
    return files, failed


def _render(records: Sequence[dict[str, Any]], problems: Sequence[str] | None, interrupted: str | None,
            ) -> tuple[dict[str, str], dict[str, str], "RunModel | None"]:
    generated = f"written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    model: RunModel | None = None
    model_error = ""
    try:
        model = build(records, problems=problems, interrupted=interrupted)
    except Exception as exc:  # noqa: BLE001 - the views that need it are named below
        model_error = f"{type(exc).__name__}: {exc}"

    def need_model() -> RunModel:
        if model is None:
            raise RuntimeError(f"the run model could not be built: {model_error}")
        return model

    views: dict[str, Callable[[], str]] = {
        "summary.md": lambda: markdown_view.summary(need_model()),
        "report.html": lambda: html_view.render_html(need_model(), generated=generated),
        "cases.csv": lambda: results_frame(list(records)).to_csv(index=False),
        "mismatches.csv": lambda: mismatches_frame(list(records)).to_csv(index=False),
    }
    files, failed = {}, {}
    for name, make in views.items():
        try:
            files[name] = make()
        except Exception as exc:  # noqa: BLE001 - reported below, results still written
            failed[name] = f"{type(exc).__name__}: {exc}"
    files["results.jsonl"] = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    return files, failed, model


def write(records: "Iterable[CaseRecord | dict[str, Any]]", report_dir: "str | Path", env: dict[str, Any] | None = None,
          *, unmatched: Sequence[str] | None = None,
          interrupted: str | None = None, step_summary: bool = True) -> Path:
    """Write the report of `records` into `report_dir` (created); return the directory.

    A record keeps the environment it carries (`env`), so merged reports keep each case's GPU and
    host; records without one get `env` (the caller probes it: `harness.run.environment`).  Every file is
    rendered before the directory is touched, written to a temporary file and then moved into
    place, results.jsonl last: a crash leaves the previous report as it was.  Also points
    ``latest`` (beside a run directory under ``reports/``) at `report_dir`, and appends a short
    summary to ``$GITHUB_STEP_SUMMARY`` when it is set and `step_summary` is true.

    `unmatched` are the expectation-problem lines shown under "Needs attention" (the runner
    computes them: `expectations.entry_problems`; the report reads no expectations).
    `interrupted` (e.g. "interrupted after 12 of 60 cases") marks an
    interrupted run in every file: a banner atop summary.md, report.html and the step summary, the
    key ``interrupted`` on every record of results.jsonl (so a column of cases.csv) and a column
    of mismatches.csv.  An empty run, or a directory that cannot be written, raises ReportError
    and writes nothing.
    """
    report_dir = Path(report_dir)
    records = as_json(records)
    if not records:
        raise ReportError(f"no results to report: the run produced no cases; nothing written to {report_dir}")
    if env and any(not r.get("env") for r in records):
        for record in records:
            record["env"] = record.get("env") or dict(env)
    if interrupted:
        for record in records:
            record["interrupted"] = interrupted
    records.sort(key=record_key)
    files, failed, model = _render(records, unmatched, interrupted)
    _prepare(report_dir)
    _commit(report_dir, files)
    for name in failed:  # an old view would contradict the new results: better none
        (report_dir / name).unlink(missing_ok=True)
    _point_latest(report_dir)
    if step_summary and model is not None:
        append_step_summary(model, report_dir)
    if failed:
        raise ReportError(f"report written to {report_dir} without {', '.join(failed)}: "
                          + "; ".join(f"{name}: {why}" for name, why in failed.items()))
    return report_dir


def write_or_fallback(records: "Sequence[CaseRecord | dict[str, Any]]", report_dir: "str | Path",
                      env: dict[str, Any] | None = None, *, unmatched: Sequence[str] | None = None,
                      interrupted: str | None = None, step_summary: bool = True) -> tuple[Path, str | None]:
    """`write` into `report_dir`; where writing there fails (`ReportWriteError`: a full disk, the
    folder gone), into a new folder under the system's temporary directory instead, so the report
    of what was judged is kept where it can be.  Returns the folder written and, after a fallback,
    the line for the user saying why `report_dir` was not and where the report is (None when it
    was).  Raises ReportWriteError when neither can be written, naming both."""
    try:
        return write(records, report_dir, env, unmatched=unmatched, interrupted=interrupted,
                     step_summary=step_summary), None
    except ReportWriteError as first:
        try:
            fallback = Path(tempfile.mkdtemp(prefix="harness-report-"))
        except OSError as exc:
            raise ReportWriteError(f"{first}; nor in a temporary folder: {exc.strerror or exc}") from None
        try:
            written = write(records, fallback, env, unmatched=unmatched, interrupted=interrupted,
                            step_summary=step_summary)
            return written, f"{first}; the report of the {len(records)} records judged is in {written} instead"
        except ReportWriteError as second:
            raise ReportWriteError(f"{first}; nor in {fallback}: {second}") from None


def _prepare(report_dir: Path) -> None:
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportWriteError(f"cannot create report directory {report_dir}: {exc.strerror or exc}") from None
    if not os.access(report_dir, os.W_OK):
        raise ReportWriteError(f"report directory {report_dir} is not writable")


def _commit(report_dir: Path, files: dict[str, str]) -> None:
    """Write each file to a temporary name in `report_dir`, then move them all into place."""
    temps: list[tuple[str, Path]] = []
    replaced, current = 0, "its files"
    try:
        for name, text in files.items():
            current = name
            fd, tmp = tempfile.mkstemp(dir=report_dir, prefix=f".{name}.", suffix=".tmp")
            temps.append((tmp, report_dir / name))
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                if hasattr(os, "fchmod"):
                    os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would hide the report from others
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        for tmp, final in temps:
            os.replace(tmp, final)
            replaced += 1
    except OSError as exc:
        kept = "no file there was replaced" if not replaced else "some of its files were replaced"
        name = current if not replaced else "moving the files into place"
        raise ReportWriteError(f"cannot write the report into {report_dir} ({name}): {exc.strerror or exc}; "
                               f"{kept}") from None
    finally:
        for tmp, _ in temps[replaced:]:
            Path(tmp).unlink(missing_ok=True)


def _point_latest(report_dir: Path) -> None:
    """Point ``<parent>/latest`` at `report_dir` where the parent is a reports root: named
    ``reports`` or already holding a ``latest`` link (never a stray link beside any --report-dir)."""
    parent = report_dir.absolute().parent
    latest = parent / "latest"
    if report_dir.name == "latest" or not (parent.name == "reports" or latest.is_symlink()):
        return
    try:
        if latest.is_symlink() or not latest.exists():
            tmp = parent / f".latest.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(report_dir.name)
            os.replace(tmp, latest)
    except OSError:
        pass  # the pointer is a convenience; the run directory itself is complete


def append_step_summary(source: "RunModel | Sequence[dict[str, Any]]", report_dir: "str | Path",
                        path: "str | Path | None" = None) -> bool:
    """Append a short summary of a run model (or of records) to ``$GITHUB_STEP_SUMMARY`` (or
    `path`) so that the file stays under 1 MiB, details folded in <details>.  Returns whether
    something was appended; never raises (a CI convenience must not fail the run: a problem is one
    line on stderr)."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    try:
        used = os.path.getsize(target) if os.path.exists(target) else 0
        summary = step_summary_markdown(source, str(report_dir), STEP_SUMMARY_LIMIT - used - 1)
        if not summary:
            print(f"harness: step summary left out: {target} is nearly 1 MiB already", file=sys.stderr)
            return False
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(summary if summary.endswith("\n") else summary + "\n")
        return True
    except Exception as exc:  # noqa: BLE001
        print(f"harness: cannot append the step summary to {target}: {exc}", file=sys.stderr)
        return False
