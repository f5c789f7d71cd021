"""Report commands of the command line: ``report`` (rebuild a report from results.jsonl)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from . import report as reporting


class UsageFailure(Exception):
    """Bad input: printed as one line by the command line, exit status 2."""


def read_results(directory: "str | Path") -> list[dict[str, Any]]:
    """Every record of DIR/results.jsonl; a missing file or a corrupt line is a UsageFailure."""
    directory = Path(directory)
    source = directory / "results.jsonl"
    if not source.is_file():
        raise UsageFailure(f"no results.jsonl in {directory}")
    records = []
    for number, line in enumerate(source.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UsageFailure(f"{source}:{number}: not a JSON record ({exc.msg})") from None
    return records


def cmd_report(args: argparse.Namespace) -> int:
    records = read_results(args.report_dir)
    if not records:
        raise UsageFailure(f"{Path(args.report_dir) / 'results.jsonl'} holds no results")
    env = records[0].get("env") or reporting.environment()
    print(f"report: {reporting.write(records, args.report_dir, env)}")
    return 0


def add_commands(sub: Any, commands: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    """Register this module's subcommands on the `python -m harness` parser."""
    p_report = sub.add_parser("report", help="rewrite the report files from a directory's results.jsonl")
    p_report.add_argument("report_dir")
    commands["report"] = cmd_report
