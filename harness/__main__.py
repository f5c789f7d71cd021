"""Command line: ``python -m harness {list,run,repro,report}`` (also installed as ``ckpt-harness``).

Exit status: 0 when every case passed or failed as expected, 1 when a case failed unexpectedly
(or an expected failure went stale), 2 for bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from . import expectations as expectations_mod
from . import impls
from . import report as reporting
from . import report_cli
from .cases import AXES, CaseError, Case, generate, parse_case_id
from .plugin import resolve_devices
from .runner import run


class UsageFailure(Exception):
    """Bad input: printed as one line, exit status 2."""


def _add_filters(parser: argparse.ArgumentParser) -> None:
    for axis, enum_type in AXES.items():
        if axis == "device":
            continue
        values = ",".join(v.value for v in enum_type)
        parser.add_argument(f"--{axis}", metavar="V[,V]", help=f"only these {axis} values: {values}")
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda, or a comma list")
    parser.add_argument("--case", action="append", default=[], metavar="ID",
                        help="run exactly this case id (repeatable); overrides the axis filters")


def _selected_cases(args: argparse.Namespace) -> list[Case]:
    if args.case:
        return [parse_case_id(case_id) for case_id in args.case]
    filters: dict[str, Any] = {axis: getattr(args, axis) for axis in AXES if axis != "device" and getattr(args, axis)}
    filters["device"] = resolve_devices(args.device)
    return list(generate(**filters))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser("list", help="print the case ids the filters select")
    _add_filters(p_list)

    p_run = sub.add_parser("run", help="run cases for one or more impls and write a report")
    _add_filters(p_run)
    p_run.add_argument("--impl", action="append", default=[], help="impl name(s) or module:factory; default bundled")
    p_run.add_argument("--report-dir", default=None, help="default: reports/<timestamp>-<pid>")
    p_run.add_argument("--expectations", default=None, help="default: cases/expectations.toml")
    p_run.add_argument("-q", "--quiet", action="store_true", help="print only the final counts")

    p_repro = sub.add_parser("repro", help="run one case and print every mismatch")
    p_repro.add_argument("case_id")
    p_repro.add_argument("--impl", default="bundled")

    report_cli.add_commands(sub, COMMANDS)
    return parser


def cmd_list(args: argparse.Namespace) -> int:
    for case in _selected_cases(args):
        print(case.id)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cases = _selected_cases(args)
    adapters = [impls.load(name) for name in impls.parse_impl_names(args.impl)]
    entries = expectations_mod.load(args.expectations)
    target = Path(args.report_dir) if args.report_dir else reporting.default_report_dir()
    _check_writable(target)
    records = []
    started = time.perf_counter()
    for adapter in adapters:
        for case in cases:
            result = run(case, adapter)
            record = reporting.annotate(result.to_dict(), expectations_mod.find(entries, adapter.name, case.id))
            record["worker"] = "main"
            records.append(record)
            if not args.quiet:
                print(f"{record['verdict']:6} {record['outcome']:11} {adapter.name} {case.id}", flush=True)
    written = reporting.write(records, target)
    counts = Counter(r["verdict"] for r in records)
    elapsed = time.perf_counter() - started
    print(f"{len(records)} cases in {elapsed:.1f}s: "
          + ", ".join(f"{counts[v]} {v}" for v in reporting.VERDICTS if counts[v]))
    print(f"report: {written}")
    return 1 if counts["fail"] or counts["stale"] else 0


def cmd_repro(args: argparse.Namespace) -> int:
    case = parse_case_id(args.case_id)
    adapter = impls.load(args.impl)
    result = run(case, adapter)
    print(f"{adapter.name} {case.id}: {result.outcome.value} ({result.duration_s:.2f}s)")
    if result.summary():
        print(result.summary())
    if result.traceback:
        print(result.traceback.rstrip())
    return 1 if result.outcome.value in ("mismatch", "error") else 0


def _check_writable(target: Path) -> None:
    existing = next((p for p in [target, *target.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageFailure(f"report directory {target} is unusable: {existing} is not a directory")


COMMANDS: dict[str, Any] = {"list": cmd_list, "run": cmd_run, "repro": cmd_repro}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m harness`` and ``ckpt-harness``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (UsageFailure, report_cli.UsageFailure, CaseError, impls.ImplError,
            expectations_mod.ExpectationError, reporting.ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
