"""Report commands of the command line.

``report DIR``: rewrite DIR's report files from its results.jsonl.
``merge DIR... --out DIR``: join the reports of separate jobs (shards, GPU types) into one; each
case keeps the environment it ran in.
``compare BASE NEW``: new failures, regressions, fixed cases and changed results; exit status 1
on a new failure or a regression (a case that passed in BASE and is unsupported or skipped in NEW).

Bad input (a missing directory, a corrupt or truncated results.jsonl line, a record that breaks the
record contract, an empty report, an unwritable output) is a `UsageError`: one line, exit status
2, and nothing already written is touched.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from ..results import record_problem
from . import ReportError, env_key, write
from . import merge as report_merge


def results_path(location: "str | Path") -> Path:
    """DIR/results.jsonl for a report directory; a path to a .jsonl (or gzipped .jsonl.gz) file as it is."""
    location = Path(location)
    is_file = location.name.endswith((".jsonl", ".jsonl.gz")) and not location.is_dir()
    return location if is_file else location / "results.jsonl"


def read_results(directory: "str | Path", *, partial: bool = False) -> list[dict[str, Any]]:
    """Every record of DIR/results.jsonl (or of a .jsonl or .jsonl.gz file given directly).

    A missing or unreadable file, a line that is not a JSON object (corrupt, or truncated by a job
    that died mid-write) or a record that breaks the record contract (`record_problem`) is a
    UsageError naming file:line.  Blank lines are skipped.  With `partial` (a run killed while
    appending, read to rebuild its report) a truncated last line is left out with a note on stderr
    instead: every record before it was flushed whole.
    """
    source = results_path(directory)
    if not source.is_file():
        where = source.parent if source.name == "results.jsonl" else source
        raise UsageError(f"no results.jsonl in {where}" if source.name == "results.jsonl"
                           else f"no such results file: {where}")
    try:
        raw = gzip.decompress(source.read_bytes()) if source.name.endswith(".gz") else source.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # gzip's BadGzipFile is an OSError; a cut or corrupt stream
        raise UsageError(f"cannot read {source}: {getattr(exc, 'strerror', None) or exc}") from None
    records = []
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        truncated = number == len(lines) and not raw.endswith(b"\n")
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"{source}:{number}: not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            if truncated and partial:
                print(f"{source}:{number}: truncated last record left out (the run was killed while "
                      "writing it)", file=sys.stderr)
                break
            what = "truncated record (the file ends mid-line)" if truncated else "not a JSON record"
            raise UsageError(f"{source}:{number}: {what} ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{source}:{number}: not a JSON object")
        problem = record_problem(record)
        if problem:
            raise UsageError(f"{source}:{number}: {problem}")
        records.append(record)
    return records


def read_nonempty(location: "str | Path", *, partial: bool = False) -> list[dict[str, Any]]:
    """`read_results`, where a report without a single result is a UsageError too."""
    records = read_results(location, partial=partial)
    if not records:
        raise UsageError(f"{results_path(location)} holds no results")
    return records


def _write(records: list[dict[str, Any]], target: "str | Path") -> Path:
    try:
        return write(records, target, env=dict(report_merge.UNKNOWN_ENV))
    except ReportError as exc:
        raise UsageError(str(exc)) from None


def cmd_report(args: argparse.Namespace) -> int:
    records = read_nonempty(args.report_dir, partial=True)  # a killed run's file ends where it died
    target = Path(args.report_dir)
    target = target.parent if target.suffix == ".jsonl" and not target.is_dir() else target
    print(f"report: {_write(records, target)}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    out = Path(args.out)
    inputs = [Path(d) for d in args.dirs]
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a directory")
    in_inputs = any(results_path(d).resolve() == (out / "results.jsonl").resolve() for d in inputs)
    if (out / "results.jsonl").exists() and not in_inputs:
        raise UsageError(f"--out {out} already holds a report; pass it as an input to merge into it, "
                           "or choose another directory")
    sources = [(str(d), read_nonempty(d)) for d in inputs]
    records, notes = report_merge.merge(sources)
    written = _write(records, out)
    envs = {env_key(r.get("env")) for r in records}
    print(f"merged {len(records)} cases from {len(sources)} reports ({len(envs)} environment"
          f"{'s' * (len(envs) != 1)}) into {written}")
    for note in notes:
        print(note)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    base = read_nonempty(args.base)
    new = read_nonempty(args.new)
    comparison = report_merge.compare(base, new, allow_missing=args.allow_missing)
    print("\n".join(comparison.lines(str(args.base), str(args.new))))
    if comparison.only_base and not args.allow_missing:
        print(f"error: {len(comparison.only_base)} case(s) of {args.base} did not run in {args.new} "
              "(--allow-missing if the selection changed on purpose)", file=sys.stderr)
    return 1 if comparison.failed else 0


def add_commands(sub: Any, commands: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    """Register this module's subcommands (report, merge, compare) on the `python -m harness` parser."""
    p_report = sub.add_parser("report", help="rewrite the report files from a directory's results.jsonl")
    p_report.add_argument("report_dir")
    commands["report"] = cmd_report

    p_merge = sub.add_parser("merge", help="merge the reports of separate jobs (shards, GPU types) into one",
                             description="Join report directories into one report. A case is kept once "
                                         "per environment (GPU and host) it ran in.")
    p_merge.add_argument("dirs", nargs="+", metavar="DIR", help="report directories (or results.jsonl files)")
    p_merge.add_argument("--out", required=True, metavar="DIR", help="where the merged report goes")
    commands["merge"] = cmd_merge

    p_compare = sub.add_parser("compare", help="new failures, regressions, fixed cases and changed results; "
                                               "exit 1 on a new failure or a regression",
                               description="Compare two reports case by case. Exit status 1 when a case "
                                           "fails in NEW that did not fail in BASE, passed in BASE and is "
                                           "unsupported or skipped in NEW, or ran in BASE and is absent "
                                           "from NEW (unless --allow-missing).")
    p_compare.add_argument("base", metavar="BASE", help="report directory (or results.jsonl) of the base run")
    p_compare.add_argument("new", metavar="NEW", help="report directory (or results.jsonl) of the new run")
    p_compare.add_argument("--allow-missing", action="store_true",
                           help="cases of BASE absent from NEW are listed, not a regression (the selection "
                                "changed on purpose)")
    commands["compare"] = cmd_compare
