"""Command line: ``python -m harness {list,run,repro,fuzz,bench,report}`` (also ``ckpt-harness``).

Exit status: 0 when every case passed or failed as expected, 1 when a case failed unexpectedly
(or failed differently than expected, or an expected failure went stale, or bundled/torch declared
a case unsupported), 2 for bad input (one line on stderr, no traceback), 130 when interrupted
(Ctrl-C) and 143 when terminated (SIGTERM, as a CI job at its time limit): every case's record is
in the report directory's results.jsonl the moment it is judged, and the report of the cases that
finished is written, marked interrupted (a second Ctrl-C does not stop that).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from packaging.version import InvalidVersion, Version

from .. import impls
from .. import report as reporting
from ..model import shards
from ..model.cases import AXES, Capture, Case, Device, parse_case_id, parse_value
from ..model.matrix import MATRICES, generate
from ..rank_context import RankContext, options_problem
from ..report import cli as report_cli
from ..report.frame import rank_flags
from ..report.live import LiveResults
from ..results import CaseRecord, Outcome, Verdict
from ..run import isolation, stops
from ..run.environment import environment
from ..run.execution import (
    REQUIRE_CUDA_ENV,
    UsageError,
    adapter_version,
    check_selection,
    cuda_visible,
    load_targets,
    proved_nothing,
    resolve_devices,
    run_case,
    run_cases_ranked,
)
from ..run.pool import CasePool, by_case
from ..run.ranks import RankGroup
from ..run.runner import REFERENCE_RUNS
from ..verdict import expectations as expectations_mod
from . import gpus, repro_script, timeline


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", default=None, choices=MATRICES,
                        help="default: the first matrix's programs over every axis plus a covering set of "
                             "programs; full: every valid program over every axis (large)")
    for axis, enum_type in AXES.items():
        if axis == "device":
            continue
        values = ",".join(v.value for v in enum_type)
        parser.add_argument(f"--{axis}", metavar="V[,V]", help=f"only these {axis} values: {values}")
    parser.add_argument("--program", metavar="NAME[,NAME]",
                        help="only these programs (e.g. flat, rand.bf16.odd.keyword.deep)")
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda, or a comma list")
    parser.add_argument("--case", action="append", default=[], metavar="ID",
                        help="run exactly this case id (repeatable, each once; not with the filters above)")


def _add_replace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(reporting.REPLACE_FLAG, dest="replace_report", action="store_true",
                        help="--report-dir may hold a report: this run replaces it (its files are removed at the "
                             "first record; without the flag such a folder is refused)")


def _add_expectations(parser: argparse.ArgumentParser) -> None:
    """The options that choose the expectation entries a command judges by (`_load_expectations`)."""
    parser.add_argument("--expectations", default=None, metavar="FILE",
                        help="replaces the shipped expectations file (cases/expectations.toml in a checkout)")
    parser.add_argument("--add-expectations", action="append", default=[], metavar="FILE",
                        help="an expectations file whose entries add to the shipped ones (and to those installed "
                             "packages register); repeatable")


def _add_ranks(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=1, metavar="N",
                        help="run each case in N processes forming one parallel layout (torch.distributed's "
                             "launcher, gloo), tracker streams seeded per rank as Megatron does; a case's verdict "
                             "is every rank's oracles plus the cross-rank one (rank-streams).  Default 1")
    parser.add_argument("--tp", type=int, default=0, metavar="K",
                        help="with --ranks: the tensor-parallel size (default: every rank; TP x CP x DP = N)")
    parser.add_argument("--cp", type=int, default=1, metavar="K",
                        help="with --ranks: the context-parallel size (default 1)")


def _check_ranks(args: argparse.Namespace) -> None:
    """One clear line for a rank count or layout that cannot be."""
    problem = options_problem(args.ranks, args.tp, args.cp)
    if problem:
        raise UsageError(problem)


def _load_expectations(args: argparse.Namespace, *, problems: bool = True) -> tuple[list[Any], list[str]]:
    """The expectation entries of ``--expectations`` (default the shipped file), installed packages'
    files and ``--add-expectations`` (`expectations.load_all`) and, with `problems`, the lines on
    entries that can never apply or that conflict (`entry_problems`), each also printed as a
    warning: the console says what the report's "Needs attention" will.  An entry naming an impl
    no implementation matches is a UsageError (a typo would otherwise silently claim nothing)."""
    entries = expectations_mod.load_all(args.expectations, args.add_expectations, impls.registered())
    expectations_mod.check_impls(entries, impls.registered(), args.expectations)
    lines = expectations_mod.entry_problems(entries, impls.registered()) if problems else []
    for line in lines:
        print(f"warning: expectations: {line}", file=sys.stderr, flush=True)
    return entries, lines


def _append_or_halt(live: LiveResults, record: CaseRecord) -> None:
    """Put `record` on disk now; a write that fails (a full disk) stops the run the way a signal
    does (`stops.WriteFailed`), so what was judged is kept and reported, and the exit status is 2."""
    try:
        live.append(record)
    except reporting.ReportWriteError as exc:
        stops.halt(stops.WriteFailed(str(exc)))


def _filters_given(args: argparse.Namespace) -> list[str]:
    """The case filters on the command line, as typed ('--layout tracked', '--device cpu')."""
    given = [f"--{name} {getattr(args, name)}" for name in [*AXES, "program", "matrix"]
             if name != "device" and getattr(args, name)]
    if args.device.strip().lower() != "auto":
        given.insert(0, f"--device {args.device}")
    return given


def _selected_cases(args: argparse.Namespace, runnable: bool = True) -> list[Case]:
    """The cases the filters (or --case ids) select.  With `runnable`, what this machine cannot run
    (cuda without a GPU, capture without cuda) is a UsageError; without, ids are only listed."""
    if args.case:
        given = [flag for flag in _filters_given(args) if not flag.startswith("--device ")]
        if given:
            raise UsageError(f"--case names whole cases: leave out {given[0].split()[0]} (the filters select cases "
                             "only without --case)")
        twice = next((case_id for n, case_id in enumerate(args.case) if case_id in args.case[:n]), None)
        if twice is not None:
            raise UsageError(f"--case {twice} is given twice: each case runs once")
        cases = [parse_case_id(case_id) for case_id in args.case]
        if args.device.strip().lower() != "auto":  # the id names the device: --device may only agree with it
            devices = resolve_devices(args.device, require_visible=False)
            other = next((c for c in cases if c.device.value not in devices), None)
            if other is not None:
                raise UsageError(f"--case {other.id} runs on {other.device.value}, which --device {args.device} "
                                 "leaves out")
        if runnable:
            check_selection(cases, [c.device.value for c in cases])
        return cases
    filters: dict[str, Any] = {axis: getattr(args, axis) for axis in [*AXES, "program"]
                               if axis != "device" and getattr(args, axis)}
    filters["device"] = resolve_devices(args.device, require_visible=runnable)
    cases = list(generate(args.matrix or "default", **filters))
    if runnable:  # what this machine cannot run says why first
        known = {c.value for c in Capture}  # unknown values were refused by generate() above
        captures = [Capture(v.strip()) for v in (args.capture or "").split(",") if v.strip() in known]
        check_selection(cases, filters["device"], captures)
    if not cases:
        given = " ".join(_filters_given(args)) or "the default matrix"
        raise UsageError(f"no case matches {given} (python -m harness list with fewer filters shows what there is)")
    return cases


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser("list", help="print the case ids the filters select (--impls: the implementations)")
    _add_filters(p_list)
    p_list.add_argument("--impls", action="store_true",
                        help="list the implementations instead: name, what it is, available here or why not")

    p_run = sub.add_parser("run", help="run cases for one or more impls and write a report")
    _add_filters(p_run)
    p_run.add_argument("--impl", action="append", default=[],
                       help="impl name(s) or module:factory; default bundled "
                            "(the names: python -m harness list --impls)")
    p_run.add_argument("--report-dir", default=None,
                       help="default: reports/<timestamp>-<pid>; a folder that holds a report is refused "
                            f"unless {reporting.REPLACE_FLAG}")
    _add_replace(p_run)
    _add_expectations(p_run)
    p_run.add_argument("-q", "--quiet", action="store_true", help="print only the final counts")
    p_run.add_argument("--shard", default=None, metavar="I/N", help="run only shard I of N")
    p_run.add_argument("--no-isolate", dest="isolate", action="store_false",
                       help="run cases in this process (faster start; a crashing case ends the run)")
    workers = p_run.add_mutually_exclusive_group()
    workers.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="N isolated case workers in all, spread over the visible GPUs (default: "
                              "--workers-per-gpu's on CUDA, 1 on the CPU)")
    workers.add_argument("--workers-per-gpu", type=int, default=None, metavar="N",
                         help="N isolated case workers on each visible GPU (default: from the host's cores and "
                              f"the GPU's memory, at most {gpus.MAX_WORKERS_PER_GPU}; printed)")
    p_run.add_argument("--case-timeout", type=float, default=isolation.DEFAULT_TIMEOUT_S, metavar="S",
                       help=f"per-case time limit in seconds when isolated (default {isolation.DEFAULT_TIMEOUT_S:g})")
    _add_ranks(p_run)
    p_run.add_argument("--require-cuda", action="store_true",
                       help="exit 2 when no CUDA device is visible instead of running the CPU subset "
                            "(also: HARNESS_REQUIRE_CUDA=1; for GPU CI jobs)")
    p_run.add_argument("--allow-unsupported", action="store_true",
                       help="run an impl named here even when its package cannot load (every case unsupported)")

    p_repro = sub.add_parser("repro", help="run one case alone and explain it: mismatches and RNG timeline")
    p_repro.add_argument("case_id")
    p_repro.add_argument("--impl", default="bundled",
                        help="impl name or module:factory (default bundled; the names: python -m harness list --impls)")
    p_repro.add_argument("--script", metavar="FILE", default=None,
                         help="also write a standalone Python script that reproduces the case")
    p_repro.add_argument("--all-streams", action="store_true",
                         help="show every stream in the timeline, not only those that diverge")
    _add_expectations(p_repro)
    p_repro.add_argument("--allow-unsupported", action="store_true",
                         help="run the impl even when its package cannot load (the case is unsupported)")

    p_fuzz = sub.add_parser("fuzz", help="run random region programs under one impl; shrink a failure to "
                                         "its smallest program")
    p_fuzz.add_argument("--impl", default="bundled",
                        help="impl name or module:factory (default bundled; the names: python -m harness list --impls)")
    p_fuzz.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    amount = p_fuzz.add_mutually_exclusive_group()
    amount.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="fuzz for this long (default 60 s)")
    amount.add_argument("--examples", type=int, default=None, metavar="N", help="generate this many programs")
    p_fuzz.add_argument("--seed", type=int, default=None, metavar="S",
                        help="random seed (default: a new one, printed, so the run can be repeated)")
    p_fuzz.add_argument("--new-only", action="store_true",
                        help="a failure the expectations file already describes does not count: look for new ones")
    p_fuzz.add_argument("--keep-going", action="store_true",
                        help="after a failure go on until the budget is spent, shrinking each failure of a new kind "
                             "(outcome and oracles)")
    p_fuzz.add_argument("--capture", metavar="V[,V]", default=None,
                        help="only these capture modes (default: every one the device has)")
    p_fuzz.add_argument("--isolate", dest="isolate", action="store_true", default=True,
                        help="run cases in a replaceable worker process (the default: a sticky CUDA error or a "
                             "crash must not poison every later case)")
    p_fuzz.add_argument("--no-isolate", dest="isolate", action="store_false", help="run cases in this process")
    p_fuzz.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="N searches side by side, each its own seed and isolated worker, spread over the "
                             "visible GPUs (default 1: a seed repeats a run only with one)")
    _add_expectations(p_fuzz)
    p_fuzz.add_argument("--save", dest="save", action="store_true", default=False,
                        help="add each new (unexpected) failure found to the corpus, which the default matrix "
                             "replays; without it nothing is written (known bugs are never added)")
    p_fuzz.add_argument("--no-save", dest="save", action="store_false", help="the default: write nothing")
    p_fuzz.add_argument("--corpus", default=None, metavar="FILE",
                        help="with --save: where a found failure is added (default: the shipped corpus, in a checkout "
                             "only: cases/corpus.toml)")
    p_fuzz.add_argument("--report-dir", default=None, metavar="DIR",
                        help="append every program's record to DIR/results.jsonl as it is judged and write a "
                             "report there at the end (also when stopped); default: no report")
    _add_replace(p_fuzz)
    _add_ranks(p_fuzz)
    p_fuzz.add_argument("--no-database", dest="database", action="store_false",
                        help="no Hypothesis example database "
                             "(default: .hypothesis/harness-fuzz replays earlier failures first)")
    p_fuzz.add_argument("--allow-unsupported", action="store_true",
                        help="run the impl even when its package cannot load (every case unsupported)")

    p_module = sub.add_parser("module",
                              help="your own model: its module checkpointed by an impl (or by itself) against "
                                   "the same module without, bit for bit, naming the first RNG draw that diverges")
    p_module.add_argument("factory", metavar="PKG.MOD:FACTORY", nargs="+",
                          help="a function returning harness.module_mode.ModelCase(module, inputs) or "
                               "(module, inputs); the module is importable from the current directory (repeatable)")
    p_module.add_argument("--impl", action="append", default=[],
                          help="impl name(s), comma lists allowed; 'as-built' judges the model's own checkpointing "
                               "(a factory taking checkpointing=True/False); default bundled")
    p_module.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    p_module.add_argument("--capture", default="eager",
                          help="eager (default), separate or single (cuda only); comma list")
    p_module.add_argument("--mode", default="nonreentrant", help="nonreentrant (default) or reentrant; comma list")
    p_module.add_argument("--wrap", action="append", default=None, metavar="PATTERN",
                          help="named_modules() paths whose forward the impl checkpoints: '*' within one path "
                               "component, '**' any depth (repeatable; default: the whole module)")
    p_module.add_argument("--iterations", type=int, default=2, metavar="K")
    p_module.add_argument("--report-dir", default=None, metavar="DIR",
                          help="write the report (results.jsonl, summary.md, report.html, CSVs) there")
    _add_replace(p_module)
    p_module.add_argument("--script", default=None, metavar="FILE",
                          help="also write a script that repeats these runs (it imports your factory)")
    p_module.add_argument("--rounding-fails", action="store_true",
                          help="count a 'rounding' outcome (no random number differs; gradients or outputs differ by "
                               "rounding only) as a failure (default: it passes, and says so)")
    p_module.add_argument("--allow-unsupported", action="store_true",
                          help="run the impl even when its package cannot load")

    p_bench = sub.add_parser("bench", help="measure speed and memory of one impl's default matrix")
    p_bench.add_argument("--impl", default="bundled",
                        help="impl name or module:factory (default bundled; the names: python -m harness list --impls)")
    p_bench.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    p_bench.add_argument("--cases", type=int, default=None, metavar="N",
                         help="cases to run in all, repeating the matrix (default: 1000 on cuda, one matrix on cpu, "
                              "and then the default matrix's wall time in a fresh process; with N, only N cases)")
    p_bench.add_argument("--jobs", default=None, metavar="N[,N]",
                         help="also time the matrix with N isolated case workers (run --jobs N), each count given")
    p_bench.add_argument("--fuzz", type=int, default=0, metavar="N",
                         help="also the fuzzer over N generated programs (fixed seed): programs/s and GPU time "
                              "per program")
    p_bench.add_argument("--json", default="bench.json", metavar="FILE",
                         help="where the figures go (default bench.json)")
    p_bench.add_argument("--allow-unsupported", action="store_true",
                         help="run the impl even when its package cannot load (every case unsupported)")

    p_exp = sub.add_parser("expectations", help="which expectation entry claims a case, and conflicts between entries")
    exp_sub = p_exp.add_subparsers(dest="action", required=True)
    p_explain = exp_sub.add_parser("explain",
                                   help="which entry claims CASE for --impl, and why each other one does not")
    p_explain.add_argument("case_id", metavar="CASE")
    p_explain.add_argument("--impl", required=True)
    p_explain.add_argument("--version", default=None, help="the impl version to judge for (versions ranges)")
    p_explain.add_argument("--machine", default=None, metavar="FACTS.json",
                           help="what the installed torch does on the machine the case ran on, for the models "
                                "(a file, or a shipped name: h200-torch2.11; default: ask this machine's torch)")
    p_explain.add_argument("--torch", default=None, metavar="VERSION",
                           help="the torch version to judge for (torch ranges; default this process's)")
    p_conflicts = exp_sub.add_parser("conflicts", help="cases of the default matrices that two entries of one impl "
                                                       "claim with different failures (exit 1 when any)")
    p_conflicts.add_argument("--device", default="cpu,cuda", help="the matrices to look in (default cpu,cuda)")
    p_audit = exp_sub.add_parser("audit", help="replay results files against the expectations: per entry the cases it "
                                               "claims rightly, stale, wrong, and the failures it misses (exit 1 on "
                                               "any wrong claim)")
    p_audit.add_argument("results", nargs="+", metavar="RESULTS",
                         help="a report directory or a results .jsonl file (matrix, fuzz, merged; any machine)")
    p_audit.add_argument("--examples", action="store_true",
                         help="also list up to 3 case ids of every stale, wrong and missed kind, and every new failure")
    p_audit.add_argument("--keep", metavar="FILE.jsonl.gz", default=None,
                         help="also write the records read, reduced to what the audit reads and gzipped: the form "
                              "cases/records/ keeps as data")
    p_audit.add_argument("--machine", default=None, metavar="FACTS.json",
                         help="facts of the machine the records ran on (a file, or a shipped name: h200-torch2.11), "
                              "for what a record's own machine_facts lack")
    p_diff = exp_sub.add_parser("diff", help="the cells of the default matrices that another expectations file "
                                             "claims differently (exit 1 when any)")
    p_diff.add_argument("old", metavar="OLD.toml", help="the expectations file to compare with (e.g. git show "
                                                        "REV:cases/expectations.toml > old.toml)")
    p_diff.add_argument("--device", default="cpu,cuda", help="the matrices to compare on (default cpu,cuda)")
    p_diff.add_argument("--machine", default=None, metavar="FACTS.json",
                        help="what the installed torch does there, for the models (a file, or a shipped name: "
                             "h200-torch2.11; default: ask this machine's torch)")
    p_diff.add_argument("--torch", default=None, metavar="VERSION",
                        help="the torch version to judge for (torch ranges; default this process's)")
    for p in (p_explain, p_conflicts, p_audit, p_diff):
        _add_expectations(p)

    report_cli.add_commands(sub, COMMANDS)
    return parser


def _version() -> str:
    """The harness's version and the torch it runs on (torch imported only when asked)."""
    from .. import __version__

    try:
        import torch

        under = f"torch {torch.__version__}"
    except Exception as exc:  # --version must answer even where torch is broken
        under = f"torch does not import: {type(exc).__name__}"
    return f"ckpt-rng-harness {__version__} ({under})"


def cmd_list(args: argparse.Namespace) -> int:
    if args.impls:
        return _list_impls()
    for case in _selected_cases(args, runnable=False):
        print(case.id)
    return 0


def _list_impls() -> int:
    """Every registered impl, one line each: name, available (or why not), what it is."""
    names = sorted(impls.registered())
    width = max(map(len, names), default=0) + 1  # the name column fits the longest name
    for name in names:
        try:
            adapter = impls.load(name)
            why = adapter.unavailable() if callable(getattr(adapter, "unavailable", None)) else None
            what = getattr(adapter, "description", "") or ""
            registration = impls.package_of(adapter)
            if registration is not None:
                what = f"(from {registration.origin}) {what}".rstrip()
        except impls.ImplError as exc:
            why, what = str(exc), ""
        print(f"{name:{width}} available    {what}" if why is None else f"{name:{width}} unavailable: {why}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    require_cuda = args.require_cuda or os.environ.get(REQUIRE_CUDA_ENV, "") not in ("", "0")
    if require_cuda and not cuda_visible():
        raise UsageError("--require-cuda: no CUDA device is visible (torch.cuda.is_available() is False): "
                           "refusing to run the CPU subset instead")
    cases = _selected_cases(args)
    targets = load_targets(args.impl, allow_unsupported=args.allow_unsupported)
    entries, problems = _load_expectations(args)
    shard = shards.parse_shard(args.shard) if args.shard else None
    if not math.isfinite(args.case_timeout) or args.case_timeout <= 0:
        raise UsageError(f"--case-timeout must be a positive number of seconds, got {args.case_timeout:g}")
    _check_ranks(args)
    slots, workers_line = worker_slots(args, cases)  # refuses its options before a report folder is made
    report_dir = Path(args.report_dir) if args.report_dir else reporting.default_report_dir()
    reporting.check_report_dir(report_dir, replace=args.replace_report)
    work = [(t, c) for t in targets for c in cases if shards.in_shard(t.name, c.id, shard)]
    if not work:
        raise UsageError("no case to run: the filters and --shard select nothing")
    if not args.case and args.device.strip().lower() == "auto":
        print(_device_line(cases), flush=True)
    if not args.quiet:
        print(workers_line, flush=True)
    progress = Progress(len(work), quiet=args.quiet)
    finished: dict[int, CaseRecord] = {}  # by position in `work`: the report's order whatever N
    interrupted, status = None, 0
    env = environment()
    live = LiveResults(report_dir, replace=args.replace_report)  # every record on disk the moment it is judged

    def keep(index: int, worker: str, record: CaseRecord) -> None:
        stops.raise_if_stopped()  # the case may have caught the KeyboardInterrupt and gone on
        record.worker, record.env = worker, env
        finished[index] = record
        try:
            _append_or_halt(live, record)  # on disk before the progress line says it was judged
        finally:
            progress.update(record)  # counted also when its write failed: the report keeps it

    pool = CasePool(slots, args.case_timeout) if args.isolate and args.ranks == 1 else None
    try:
        with stops.stoppable():
            if args.ranks > 1:  # each case in N processes, one launch per impl (harness.run.ranks)
                for target in targets:
                    mine = [index for index, (t, _) in enumerate(work) if t is target]
                    for position, done in run_cases_ranked(target, [work[i][1] for i in mine], entries, args.ranks,
                                                           args.case_timeout, args.tp, args.cp):
                        keep(mine[position], f"ranks{args.ranks}", done.record)
            elif pool is not None:
                pool.run(work, entries, lambda index, number, done: keep(index, f"w{number}", done.record))
            else:  # case by case, so each case's reference run is made once (pool.by_case)
                for index in (i for group in by_case(work) for i in group):
                    target, case = work[index]
                    keep(index, "main", run_case(target, case, entries).record)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM (stops.Terminated), a failed write (stops.WriteFailed)
        interrupted = f"{stops.describe(stop)} after {len(finished)} of {len(work)} cases"
        status = stops.status(stop)
        if isinstance(stop, stops.WriteFailed):
            print(f"error: {stop.message}; stopped after {len(finished)} of {len(work)} cases", file=sys.stderr,
                  flush=True)
        else:
            print(f"\n{interrupted}: writing the report of the finished cases", file=sys.stderr, flush=True)
    finally:
        live.close()
        if pool is not None:
            with stops.shielded():
                pool.close()
    records = [finished[index] for index in sorted(finished)]
    if interrupted and not records:
        kept = f"the report in {report_dir} is unchanged" if reporting.report_files_in(report_dir) else \
            f"{report_dir} holds none"
        print(f"no case finished: nothing to report ({kept})", file=sys.stderr)
        return status
    with stops.shielded():  # a second Ctrl-C or SIGTERM must not cost the report of what finished
        written, elsewhere = reporting.write_or_fallback(records, report_dir, env, unmatched=problems,
                                                         interrupted=interrupted)
    progress.finish(written)
    if elsewhere:
        print(f"error: {elsewhere}", file=sys.stderr)
        return stops.WRITE_FAILED
    if interrupted:
        return status
    idle = [] if args.allow_unsupported else proved_nothing(targets, records)
    for line in idle:
        print(f"error: {line}", file=sys.stderr)
    counts = Counter(r.verdict for r in records)
    return 1 if counts[Verdict.FAIL] or counts[Verdict.STALE] or idle else 0


def worker_slots(args: argparse.Namespace, cases: Sequence[Case]) -> tuple[list[str | None], str]:
    """The GPU each isolated case worker is pinned to (None: not pinned) and a line saying how
    many workers run and why.  CPU-only runs default to one worker (a CPU case already uses every
    core); CUDA runs to `gpus.default_workers_per_gpu` on every visible GPU."""
    for flag, value in (("--jobs", args.jobs), ("--workers-per-gpu", args.workers_per_gpu)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.ranks > 1:  # the ranks are the workers: one launch of N processes per impl, no pool
        if args.jobs is not None or args.workers_per_gpu is not None:
            raise UsageError("--ranks runs every case in one group of rank processes: leave out --jobs and "
                             "--workers-per-gpu")
        if not args.isolate:
            raise UsageError("--ranks runs every case in rank processes of its own: leave out --no-isolate")
        layout = RankContext(0, args.ranks, args.tp, args.cp)
        return [], (f"ranks: every case in {args.ranks} rank processes ({layout.label()}), one launch per impl "
                    "(--ranks)")
    if not args.isolate:
        if (args.jobs or 1) > 1 or args.workers_per_gpu is not None:
            raise UsageError("--jobs and --workers-per-gpu run isolated workers: leave out --no-isolate")
        return [], "case workers: none (--no-isolate: every case runs in this process)"
    if not any(case.device is Device.CUDA for case in cases):
        if args.workers_per_gpu is not None:
            raise UsageError("--workers-per-gpu: no selected case runs on CUDA (--jobs N sets the CPU's workers)")
        jobs = args.jobs or 1
        return [None] * jobs, f"case workers: {jobs} (CPU cases{'' if args.jobs else '; --jobs N for more'})"
    ids = gpus.cuda_gpu_ids()
    if args.jobs is not None:
        return (gpus.spread(ids, args.jobs),
                f"case workers: {args.jobs} on {len(ids)} GPU(s) (--jobs)")
    if args.workers_per_gpu is not None:
        per_gpu, why = args.workers_per_gpu, "--workers-per-gpu"
    else:
        per_gpu, why = gpus.default_workers_per_gpu(len(ids), os.cpu_count() or 1, gpus.gpu_memory_bytes())
    return (gpus.plan_slots(ids, per_gpu),
            f"case workers: {per_gpu * len(ids)}, {per_gpu} per GPU on {len(ids)} GPU(s) ({why}; "
            "--workers-per-gpu N to change)")


def _device_line(cases: Sequence[Case]) -> str:
    """The first line of an auto-device run: which device the cases run on, and why."""
    if cuda_visible():
        import torch

        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return (f"device: cuda ({torch.cuda.device_count()} visible: {', '.join(names)}), "
                f"{len(cases)} cases (--device cpu for the CPU subset)")
    return (f"device: no CUDA device visible (torch.cuda.is_available() is False): running the CPU subset, "
            f"{len(cases)} cases (--require-cuda or {REQUIRE_CUDA_ENV}=1 makes that an error)")


class Progress:
    """Running outcome counts: one rewritten line on a terminal, plain lines otherwise."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.tty = sys.stdout.isatty()
        self.counts: Counter[str] = Counter()
        self.started = time.perf_counter()
        self.reference_runs = self.with_reference = 0  # reference runs made; cases that needed one

    def _counts(self) -> str:
        return ", ".join(f"{self.counts[v]} {v}" for v in reporting.VERDICTS if self.counts[v])

    def update(self, record: CaseRecord) -> None:
        verdict, outcome = Verdict(record.verdict).value, record.outcome.value
        self.counts[verdict] += 1
        runs = record.extra.get(REFERENCE_RUNS)
        if runs is not None:
            self.reference_runs += runs
            self.with_reference += 1
        done = sum(self.counts.values())
        note = f"\n    {record.verdict_note}" if record.verdict_note else ""
        if self.tty:
            print(f"\r[{done}/{self.total}] {self._counts()}\x1b[K", end="", flush=True)
            if verdict in ("fail", "stale"):
                print(f"\r{verdict:6} {outcome:11} {record.impl} {record.case_id}\x1b[K{note}")
        elif not self.quiet:
            if done == 1:  # the columns, once
                print(f"[done/total] {'verdict':6} {'outcome':11} impl case", flush=True)
            print(f"[{done}/{self.total}] {verdict:6} {outcome:11} {record.impl} {record.case_id}{note}", flush=True)

    def finish(self, written: Path) -> None:
        if self.tty:
            print()
        elapsed = time.perf_counter() - self.started
        references = (f"; {self.reference_runs} reference run{'s' if self.reference_runs != 1 else ''} for the "
                      f"{self.with_reference} case{'s' if self.with_reference != 1 else ''} that ran"
                      if self.with_reference else "")
        print(f"{sum(self.counts.values())} cases in {elapsed:.1f}s: {self._counts() or 'none'}{references}")
        print(f"report: {written}")


def cmd_repro(args: argparse.Namespace) -> int:
    case = parse_case_id(args.case_id)
    check_selection([case], [case.device.value])
    [target] = load_targets([args.impl], allow_unsupported=args.allow_unsupported)
    entries, _ = _load_expectations(args, problems=False)
    if args.script:
        if getattr(target.adapter, "compiled", False):
            # The script re-implements the workload eagerly; it would reproduce another program.
            raise UsageError(f"--script does not cover compiled impls ({target.name}): the script runs the "
                             "program eagerly; rerun with `python -m harness repro` instead")
        if getattr(target.adapter, "save_region", None) and any(s.save is not None for s in case.program.sites()):
            # The script runs save(...) sites as plain code: under an impl that keeps SAVE regions
            # it would reproduce another program.
            raise UsageError(f"--script does not mark SAVE regions yet ({target.name} keeps them); rerun with "
                             "`python -m harness repro` instead")
        reporting.check_output_file(args.script, "--script")
    done = run_case(target, case, entries, timeline=True)
    result, record = done.result, done.record
    print(f"{target.name} {case.id}: {result.outcome.value} ({result.duration_s:.2f}s); verdict {record.verdict.value}")
    if record.verdict_note:
        print(record.verdict_note)
    elif record.expected_failure:
        print(f"expected to fail: {record.expected_outcome}: {record.expected_failure.splitlines()[0]}")
    if result.reason:
        print(result.reason)
    if result.error:
        print(result.error)
        print(result.traceback.rstrip())
    print_mismatches(result.mismatches)
    timelines = result.timelines
    if timelines.get("checkpointed"):
        rows = timeline.rows(timelines["reference"], timelines["checkpointed"])
        streams = None if args.all_streams else sorted({r["stream"] for r in rows if r[""]}) or None
        note = " (states read at capture time, relative to the capture)" if case.capture.value != "eager" else ""
        print(f"\nRNG timeline, reference vs checkpointed{note}:")
        print(timeline.render(timelines["reference"], timelines["checkpointed"], streams))
    if args.script:
        reporting.write_output_file(args.script, repro_script.render(case, args.impl), "--script")
        print(f"\nstandalone script: {args.script} (python {args.script}; exit 1 when the mismatch reproduces)")
    return 1 if result.outcome.value in ("mismatch", "error", "crash", "timeout") else 0


def print_mismatches(mismatches: Sequence[Any], indent: str = "") -> None:
    """The mismatches grouped by oracle, one line each, as `repro` shows them."""
    by_oracle: dict[str, list[str]] = {}
    for mismatch in mismatches:
        by_oracle.setdefault(mismatch.oracle, []).append(mismatch.message())
    for oracle, lines in by_oracle.items():
        print(f"\n{indent}{oracle} ({len(lines)}):")
        print("\n".join(f"{indent}  {line}" for line in lines))


def cmd_fuzz(args: argparse.Namespace) -> int:
    from . import fuzz

    [target] = load_targets([args.impl], allow_unsupported=args.allow_unsupported)
    [device] = resolve_devices(args.device)[:1]
    # the entries' problems only where a report shows them (computing them costs seconds before the first program)
    entries, problems = _load_expectations(args, problems=bool(args.report_dir))
    budget = _check_fuzz_args(args)
    captures = _fuzz_captures(args, target, device)
    seed_value = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    amount = f"{args.examples} programs" if args.examples is not None else f"{budget:g} s"
    isolate = args.isolate  # on by default, as in every front (README, "Isolation")
    group = RankGroup(args.ranks, isolation.DEFAULT_TIMEOUT_S, args.tp, args.cp) if args.ranks > 1 else None
    where = f", on {args.ranks} ranks ({group.layout.label()})" if group is not None else ""
    print(f"fuzz {target.name} on {device}: {amount}, seed {seed_value}{', isolated' if isolate else ''}{where}"
          f"{', new failures only' if args.new_only else ''}", flush=True)
    pool, workers = _fuzz_workers(args, device, group)
    progress = FuzzProgress()
    env = environment()
    # each program's record as judged
    live = LiveResults(args.report_dir, replace=args.replace_report) if args.report_dir else None
    records: dict[str, CaseRecord] = {}  # by case id: a case run again (shrinking, a repeat) once

    def keep(record: CaseRecord) -> None:
        record.env = env
        records[record.case_id] = record
        if live is not None:
            _append_or_halt(live, record)

    found = None
    try:
        with stops.stoppable():
            options = dict(examples=args.examples, budget=budget, seed_value=seed_value, new_only=args.new_only,
                           keep_going=args.keep_going, captures=captures,
                           database=fuzz.DATABASE_DIR if args.database else None, progress=progress.update,
                           on_record=keep)
            if len(workers) > 1:
                found = fuzz.fuzz_parallel(target, Device(device), entries, workers, **options)
            else:
                found = fuzz.fuzz(target, Device(device), entries, worker=workers[0], **options)
    except KeyboardInterrupt as stop:  # outside a case (setting up, or between Hypothesis batches)
        found = fuzz.FuzzResult.of_records(list(records.values()), stop)  # what ran is on disk and in `records`
    finally:
        with stops.shielded():
            _close_fuzz(live, pool, group, found)
    progress.done()
    with stops.shielded():  # a second Ctrl-C or SIGTERM must not cost what was found
        return _fuzz_summary(args, target, found, list(records.values()), env, entries, problems)


def _check_fuzz_args(args: argparse.Namespace) -> float | None:
    """Refuse bad fuzz options (`UsageError`, one line) before anything starts; the budget in
    seconds (60 where neither --examples nor --budget is given; None with --examples)."""
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples must be at least 1, got {args.examples}")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and not args.isolate:
        raise UsageError("--jobs runs isolated workers: leave out --no-isolate")
    if args.jobs > 1 and args.examples is not None and args.examples < args.jobs:
        raise UsageError(f"--examples {args.examples} cannot be shared among --jobs {args.jobs} searches")
    _check_ranks(args)
    if args.ranks > 1 and args.jobs > 1:
        raise UsageError("--ranks runs one search on one group of ranks: leave out --jobs")
    if args.ranks > 1 and not args.isolate:
        raise UsageError("--ranks runs every program in rank processes: leave out --no-isolate")
    _check_fuzz_outputs(args)
    return 60.0 if args.examples is None and args.budget is None else args.budget


def _check_fuzz_outputs(args: argparse.Namespace) -> None:
    """Refuse, before the search, a --corpus or --report-dir a fuzz run could not write (and --save
    where the harness is installed without --corpus)."""
    if args.corpus and args.save:
        reporting.check_output_file(args.corpus, "--corpus")
    elif args.save:
        _default_corpus()  # an installed harness refuses before the search, not after it
    if args.report_dir:
        reporting.check_report_dir(args.report_dir, replace=args.replace_report)


def _fuzz_captures(args: argparse.Namespace, target: Any, device: str) -> list[Any] | None:
    """The capture modes of --capture (None: every one the device has), refused where the device
    cannot capture; and a `UsageError` where the impl's declared limits leave nothing to draw on
    this device with them (`fuzz.undrawable`)."""
    from ..impls import limits
    from . import fuzz

    captures = [parse_value("capture", v) for v in args.capture.split(",") if v.strip()] if args.capture else None
    if captures:
        check_selection([], [device], captures)
    nothing = fuzz.undrawable(limits.of(target.adapter), Device(device), captures)
    if nothing:
        raise UsageError(f"{target.name} declares no {device} program it can run here: {nothing}")
    return captures


def _fuzz_workers(args: argparse.Namespace, device: str, group: Any) -> tuple[Any, list[Any]]:
    """The isolated case workers (a `CasePool`, None without isolation or with ranks) and the
    workers the searches run in: the pool's, or the rank group (started here), or None (in this
    process).  One worker keeps the devices this process sees; several are spread over the GPUs."""
    slots = [None] if args.jobs == 1 else gpus.pinned(device, args.jobs)
    pool = CasePool(slots, isolation.DEFAULT_TIMEOUT_S) if args.isolate and group is None else None  # all start at once
    workers: list[Any] = pool.workers if pool is not None else [group]  # a rank group runs as one worker
    if group is not None:
        group.start()
    if args.jobs > 1:
        print(f"{args.jobs} searches side by side, one isolated worker each"
              f"{' on GPUs ' + ','.join(str(g) for g in slots) if slots[0] is not None else ''}"
              " (not deterministic for a seed: --jobs 1 repeats a run)", flush=True)
    return pool, workers


def _close_fuzz(live: Any, pool: Any, group: Any, found: Any) -> None:
    """Close what a fuzz run opened: its live results file, its workers, its rank group (killed
    where the search was stopped: it does not wait for the ranks to finish their program)."""
    if live is not None:
        live.close()
    if pool is not None:
        pool.close()
    if group is not None:
        group.close(kill=found is None or found.stopped is not None)


def _fuzz_summary(args: argparse.Namespace, target: Any, found: Any, records: list[CaseRecord],
                  env: dict[str, Any], entries: list[Any], problems: list[str]) -> int:
    """Print what a fuzz run found (and write its report with --report-dir); its exit status."""
    stopped = found.stopped
    _print_stopped(found)
    elsewhere = _fuzz_report(args, found, records, env, problems)
    summary = _fuzz_counts(found)
    known = f"; known failures by entry: {found.known_kinds()}" if found.known else ""
    _print_stale(found)
    _print_drawn(found, target.name)
    if not found.findings:
        noisy = f"; {found.noisy} failures not repeated bit for bit by a second run (nondeterministic " \
                "attention backward), not counted" if found.noisy else ""
        if found.out_of_memory:
            noisy += f"; {found.out_of_memory} failures the device's running out of memory, not counted"
        print(f"no {'new ' if args.new_only else ''}failure in {summary}{known}{noisy}")
        return stops.WRITE_FAILED if elsewhere else stops.status(stopped) if stopped else 0
    alike: list[str] = []  # the entries that new failures look like (each expects just that failure)
    for number, finding in enumerate(found.findings, 1):
        like = _print_finding(finding, found, entries, number, len(found.findings), target.name)
        if like is not None:
            alike.append(like)
        if finding.run.record.verdict is Verdict.FAIL:  # a known bug (an entry claims it): nothing new to keep
            _keep_finding(args, finding, target.name)
    repeats = f", {found.repeats} more like them" if found.repeats else ""
    if found.noisy:
        repeats += f", {found.noisy} not repeated bit for bit by a second run (nondeterministic attention backward)"
    if found.out_of_memory:
        repeats += f", {found.out_of_memory} out of device memory (not counted)"
    kinds = "new kind" if args.new_only else "kind"
    like = f", {len(alike)} like an entry: {', '.join(dict.fromkeys(alike))}" if alike else ""
    print(f"\n{len(found.findings)} failure{'s' if len(found.findings) > 1 else ''} ({len(found.findings)} {kinds}"
          f"{'s' if len(found.findings) > 1 else ''}{like}){repeats} in {summary}{known}")
    return stops.WRITE_FAILED if elsewhere else stops.status(stopped) if stopped else 1


def _print_stopped(found: Any) -> None:
    """The line saying why a fuzz run stopped early (stderr), if it did."""
    stopped = found.stopped
    if isinstance(stopped, stops.WriteFailed):
        print(f"\nerror: {stopped.message}; stopped after {found.tried} programs", file=sys.stderr, flush=True)
    elif stopped is not None:
        print(f"\n{stops.describe(stopped)} after {found.tried} programs", file=sys.stderr, flush=True)


def _fuzz_report(args: argparse.Namespace, found: Any, records: list[CaseRecord], env: dict[str, Any],
                 problems: list[str]) -> str | None:
    """With --report-dir, write the fuzz run's report and say where; the error of a report written
    elsewhere (the folder could not be written), else None."""
    if not (args.report_dir and records):
        return None
    stopped = found.stopped
    interrupted = f"{stops.describe(stopped)} after {found.tried} programs" if stopped else None
    written, elsewhere = reporting.write_or_fallback(records, Path(args.report_dir), env, unmatched=problems,
                                                     interrupted=interrupted)
    # the report holds one record per case: a program the search drew twice is one case there
    twice = f" ({len(records)} cases: a program drawn more than once is one case)" \
        if len(records) != found.tried else ""
    print(f"report:  {written}{twice}")
    if elsewhere:
        print(f"error: {elsewhere}", file=sys.stderr)
    return elsewhere


def _fuzz_counts(found: Any) -> str:
    """'200 programs, 187 judged (93 %; 41.0 s, 4.6 judged/s): 150 pass, 37 xfail, 13 skip': the
    programs run, the share of them judged (neither unsupported nor skipped, no failure
    discounted; rounded down), the time and the judged programs per second, and the verdicts."""
    counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(found.verdicts.items()))
    rate = found.judged / found.seconds if found.seconds else 0.0
    percent = f"{found.judged_percent} %; " if found.tried else ""
    return (f"{found.tried} programs, {found.judged} judged ({percent}{found.seconds:.1f} s, {rate:.1f} judged/s): "
            f"{counts or 'none ran'}")


def _print_stale(found: Any) -> None:
    """The cases an entry expects to fail that passed (an entry that over-claims), if any."""
    if found.stale:
        shown = "\n  ".join(found.stale[:5]) + (f"\n  ... {len(found.stale) - 5} more" if len(found.stale) > 5 else "")
        print(f"stale: {len(found.stale)} cases an entry expects to fail passed:\n  {shown}")


def _print_drawn(found: Any, impl: str) -> None:
    """What the draws kept to: the impl's declared limits, and the programs drawn that it declined
    (by reason, most first), never run and never counted as judged."""
    from ..impls import limits

    if found.limits:
        print(f"drawn:   within {impl}'s declared limits ({limits.describe(found.limits)})")
    if found.declined:
        total = sum(found.declined.values())
        reasons = "; ".join(f"{reason} x{n}" for reason, n in
                            sorted(found.declined.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"drawn:   {total} more program{'s' if total != 1 else ''} {impl} declines, not run: {reasons}")


def _keep_finding(args: argparse.Namespace, finding: Any, impl: str) -> None:
    """Add a new failure to the corpus with --save (say why not otherwise)."""
    from ..model import corpus
    from . import fuzz

    if args.save and not finding.shrunk:
        print("corpus:  not saved (stopped before it was shrunk: run the fuzzer again, its database replays it)")
        return
    if not args.save:
        print("corpus:  not saved (--save adds it to cases/corpus.toml, which the default matrix replays)")
        return
    path = Path(args.corpus) if args.corpus else _default_corpus()
    try:
        added = corpus.append(finding.run.result.case, impl, fuzz.outcome_text(finding.run.record), path)
    except OSError as exc:
        raise reporting.ReportWriteError(f"cannot write --corpus {path}: {exc.strerror or exc}") from None
    print(f"corpus:  {'added to' if added else 'already in'} {path} (the default matrix replays it; "
          "a known bug of an impl needs an entry in the expectations file too)")


def _default_corpus() -> Path:
    """Where `fuzz --save` adds a finding without --corpus: the shipped corpus in a checkout; an
    installed harness's lies in site-packages, which a run must not edit (UsageError, one line)."""
    from .. import data as shipped_data
    from ..model import corpus

    if not shipped_data.in_checkout():
        raise UsageError("fuzz --save: this harness is installed, and its shipped corpus is not yours to edit: "
                         "name a file of your project with --corpus FILE")
    return corpus.DEFAULT_PATH


def _print_finding(finding: Any, found: Any, entries: list[Any], number: int, total: int, impl: str) -> str | None:
    """Print one finding; the label of the entry that expects just this failure where no entry
    claims it (None otherwise)."""
    from ..verdict import audit
    from . import fuzz

    result, record = finding.run.result, finding.run.record
    case = result.case
    label = f"failure {number} of {total}" if total > 1 else "failure"
    if finding.shrunk:
        print(f"\n{label} after {finding.found_after} programs ({finding.found_seconds:.1f} s); shrunk in "
              f"{finding.shrink_steps} more runs ({finding.shrink_seconds:.1f} s) to:")
    else:
        print(f"\n{label} after {finding.found_after} programs ({finding.found_seconds:.1f} s); stopped while "
              f"shrinking ({finding.shrink_steps} runs, {finding.shrink_seconds:.1f} s): the smallest seen so far:")
    print(f"  case     {case.id}")
    print(f"  program  {case.program.spec}")
    print(f"  outcome  {fuzz.outcome_text(record)} (verdict {record.verdict.value})")
    print(f"  differs  {fuzz.differs(record, case)}")
    repeats = fuzz.repeat_lines(found, record)
    if repeats:
        print(f"  repeats  {sum(found.repeat_shapes.get(fuzz.signature(record), {}).values())} more of this kind "
              "(outcome and oracles), by what differs:")
        print("\n".join(f"           {line}" for line in repeats))
    if finding.flaky:
        print("  flaky    this case failed, then passed when Hypothesis ran it again")
    if record.verdict is Verdict.XFAIL:
        print(f"  known    {record.expected_failure.splitlines()[0]}")
    elif record.verdict_note:
        print(f"  note     {record.verdict_note}")
    expecting = None
    if record.verdict is Verdict.FAIL and not record.expected_entry and not record.verdict_note:
        # no entry claims it (and it is no wrong failure, no fault outside the impl): which one expects it?
        expecting = audit.expecting_entry(entries, impl, record.outcome.value, [m.oracle for m in record.mismatches],
                                          record.error, record.impl_version, case=case,
                                          ranks=int(record.extra.get("ranks") or 1))
        if expecting is not None:
            print(f"  like     {expecting.label}: that entry expects this failure, but its cases do not reach this "
                  "one (its bug in a new shape, or another bug that fails alike; `expectations explain` says "
                  "what it misses)")
    print_mismatches(result.mismatches, indent="  ")
    if result.error:
        print(f"\n  {result.error}")
    ranks = int(record.extra.get("ranks") or 1)
    print(f"\nrerun:   {reporting.repro_command({'case_id': case.id, 'impl': impl, **record.extra})}")
    flags = f" {rank_flags(ranks, record.extra.get('rank_layout'))}" if ranks > 1 else ""
    print(f"matrix:  pytest cases --impl {impl} --program '{case.program.spec}'{flags}")
    return expecting.label if expecting is not None else None


class FuzzProgress:
    """Programs run so far, those judged and the judged programs per second: one rewritten line on
    a terminal (stderr), else a line every 30 s."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.started = self.last = time.perf_counter()
        self.tried = 0
        self.shown = False

    def update(self, found: Any) -> None:
        self.tried = found.tried
        now = time.perf_counter()
        if not self.tty and now - self.last < 30:
            return
        self.last = now
        elapsed = now - self.started
        counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(found.verdicts.items()))
        rate = found.judged / elapsed
        line = f"[{elapsed:6.1f} s] {found.tried} programs, {found.judged} judged ({rate:.1f} judged/s): {counts}"
        if found.shrink_steps:
            line += f"; shrinking ({found.shrink_steps} runs)"
        if self.tty:
            print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)
            self.shown = True
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    [target] = load_targets([args.impl], allow_unsupported=args.allow_unsupported)
    [device] = resolve_devices(args.device)[:1]
    total = args.cases if args.cases is not None else (1000 if device == "cuda" else len(list(generate(device=device))))
    if total < 1:
        raise UsageError(f"--cases must be at least 1, got {total}")
    reporting.check_output_file(args.json, "--json")
    try:
        jobs = [int(n) for n in args.jobs.split(",")] if args.jobs is not None else []
    except ValueError:
        jobs = [0]
    if any(n < 1 for n in jobs):  # `--jobs ''` too: a value that names no count is no request for none
        raise UsageError(f"--jobs: every count must be at least 1, got {args.jobs!r}")
    if args.fuzz < 0:
        raise UsageError(f"--fuzz must be at least 0, got {args.fuzz}")
    figures = bench.bench(target, device, total, matrix_wall=args.cases is None, jobs=jobs, fuzz_programs=args.fuzz)
    print(bench.render(figures))
    reporting.write_output_file(args.json, bench.json_text(figures), "--json")
    print(f"figures: {args.json}")
    return 0


def cmd_module(args: argparse.Namespace) -> int:
    """Judge the factories' modules under each impl, capture and mode: plan (every bad input
    refused first), run, then the summary, report and script; exit 1 on a failure or an impl
    that judged nothing."""
    targets, device, runs = _module_plan(args)
    records = _run_modules(args, runs, device)
    return _module_outputs(args, targets, records)


def _module_plan(args: argparse.Namespace) -> tuple[list[Any], str, list[tuple[str, Any, Capture, Any]]]:
    """The targets, the device and every (factory, target, capture, mode) run `module` makes;
    bad input is a UsageError before anything runs."""
    from ..run.execution import Target
    from . import module_mode

    if os.getcwd() not in sys.path and "" not in sys.path:
        # `python -m harness` has the current folder on sys.path and the ckpt-harness script does
        # not: a factory of the user's own folder (mymodel:factory) must import under both
        sys.path.insert(0, os.getcwd())
    names = impls.parse_impl_names(args.impl)
    others = [n for n in names if n != module_mode.AS_BUILT]
    loaded = {t.name: t for t in load_targets(others, allow_unsupported=args.allow_unsupported)} if others else {}
    targets = [loaded.get(n) or Target(n, module_mode.AsBuilt()) for n in names]
    compiled = [t.name for t in targets if getattr(t.adapter, "compiled", False)]
    if compiled:  # it would run the model eagerly and call that a verdict on the compiled checkpoint
        raise UsageError(f"--impl {', '.join(compiled)} checkpoints by compiling the program (torch.compile), which "
                         "module mode does not do to your model: judge it on the matrix (python -m harness run "
                         f"--impl {compiled[0]})")
    [device] = resolve_devices(args.device)[:1]
    captures, modes = _module_axes(args, device)
    if args.report_dir:
        reporting.check_report_dir(args.report_dir, replace=args.replace_report)
    if args.script:
        reporting.check_output_file(args.script, "--script")
    if args.wrap and all(t.name == module_mode.AS_BUILT for t in targets):
        raise UsageError(f"--wrap selects what an impl checkpoints; --impl {module_mode.AS_BUILT} checkpoints what "
                           "the model itself does (name another impl beside it for --wrap to apply)")
    runs = [(factory, target, capture, mode) for factory in args.factory for target in targets
            for capture in captures for mode in (modes[:1] if target.name == module_mode.AS_BUILT else modes)]
    return targets, device, runs


def _module_axes(args: argparse.Namespace, device: str) -> tuple[list[Capture], list[Any]]:
    """The capture modes and checkpoint modes a module run crosses (``--capture``, ``--mode``);
    UsageError for none, a graph capture off CUDA, or fewer than two iterations."""
    captures = [parse_value("capture", v.strip()) for v in args.capture.split(",") if v.strip()]
    modes = [parse_value("mode", v.strip()) for v in args.mode.split(",") if v.strip()]
    if not captures or not modes:
        raise UsageError("--capture and --mode need at least one value each")
    graphs = [c.value for c in captures if c is not Capture.EAGER]
    if graphs and device != "cuda":
        raise UsageError(f"--capture {','.join(graphs)} needs --device cuda")
    if args.iterations < 2:
        raise UsageError(f"--iterations must be at least 2 (the second shows what a leaked draw does next), "
                           f"got {args.iterations}")
    return captures, modes


def _run_modules(args: argparse.Namespace, runs: list[tuple[str, Any, Capture, Any]], device: str
                 ) -> list[CaseRecord]:
    """Each run's summary printed as it finishes, and its record."""
    from . import module_mode, module_report

    records: list[CaseRecord] = []
    for number, (factory, target, capture, mode) in enumerate(runs):
        try:
            wrap = None if target.name == module_mode.AS_BUILT else args.wrap  # the model's own choice
            result = module_mode.run_module(factory, target.adapter, device, capture, mode, wrap,
                                            args.iterations, name=target.name)
        except module_mode.ModuleError as exc:
            raise UsageError(str(exc)) from None
        print(("\n" if number else "") + module_report.summary(factory, target.name, device, capture, mode, result),
              flush=True)
        version = None if target.name == module_mode.AS_BUILT else adapter_version(target.adapter)
        records.append(module_report.record(result, factory, target.name, version, device, capture, mode,
                                            wrap, must_support=result.must_support,
                                            rounding_fails=args.rounding_fails))
    return records


def _module_outputs(args: argparse.Namespace, targets: list[Any], records: list[CaseRecord]) -> int:
    """The counts line, the report and the script of a module run; its exit status."""
    from . import module_report

    counts = Counter(Verdict(r.verdict).value for r in records)
    rounding = sum(1 for r in records if r.outcome is Outcome.ROUNDING)
    if len(records) > 1:
        print(f"\n{len(records)} runs: " + ", ".join(f"{counts[v]} {v}" for v in reporting.VERDICTS if counts[v])
              + (f" ({rounding} rounding: no random number differs, gradients by rounding only"
                 + (", counted as failures" if args.rounding_fails else "") + ")" if rounding else ""))
    elsewhere = None
    if args.report_dir:
        written, elsewhere = reporting.write_or_fallback(records, Path(args.report_dir), environment())
        print(f"report: {written}")
        if elsewhere:
            print(f"error: {elsewhere}", file=sys.stderr)
    if args.script:
        argv = [a for a in (args.raw_argv or []) if a]
        reporting.write_output_file(args.script, module_report.script(_without_outputs(argv)), "--script")
        print(f"script: {args.script} (python {args.script}; exit 1 when the divergence reproduces)")
    idle = proved_nothing(targets, records)
    for line in idle:
        print(f"error: {line}", file=sys.stderr)
    if elsewhere:
        return stops.WRITE_FAILED
    return 1 if counts["fail"] or idle else 0


def _without_outputs(argv: Sequence[str]) -> list[str]:
    """`argv` less --script and --report-dir (and their values): what a script repeats."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--script", "--report-dir"):
            skip = True
            continue
        if arg == reporting.REPLACE_FLAG:
            continue
        if arg.startswith(("--script=", "--report-dir=")):
            continue
        out.append(arg)
    return out


def cmd_expectations(args: argparse.Namespace) -> int:
    entries, _ = _load_expectations(args, problems=False)
    if args.action == "explain":
        case = parse_case_id(args.case_id)
        if ":" not in args.impl and args.impl not in impls.registered():
            raise UsageError(f"--impl {args.impl!r} is no known implementation; the names: python -m harness list "
                             "--impls (an import path pkg.mod:factory also counts)")
        if args.version is not None:
            _pep440(args.version, "--version", "2.11.0, 0.16.1")
        from ..verdict import diff

        machine = diff.load_machine(args.machine) if args.machine else None
        found = expectations_mod.find(entries, args.impl, case, version=args.version, torch_version=args.torch,
                                      machine=machine)
        print(f"{args.impl} {case.id}: " + (f"claimed by {found.label}: expects {found.expected()}" if found
                                             else "no entry claims it: a failure is a failure, a pass a pass"))
        if found is not None and found.prediction is not None:
            for line in found.prediction.why:
                print(f"  why   {line}")
            if found.also:
                print(f"  with  {', '.join(found.also)} (their models compose with its)")
        lines = expectations_mod.explain(entries, args.impl, case, version=args.version, torch_version=args.torch,
                                         machine=machine)
        print("\n".join(lines) if lines else f"  (no entry names {args.impl})")
        return 0
    if args.action == "audit":
        return _audit(args, entries)
    if args.action == "diff":
        return _diff(args, entries)
    devices = _matrix_devices(args.device)
    lines = expectations_mod.conflicts(entries, [c for d in devices for c in generate(device=d)])
    print("\n".join(lines) if lines else "no conflicts")
    return 1 if lines else 0


def _matrix_devices(value: str) -> list[str]:
    """The devices of a ``--device cpu,cuda`` list of the expectations commands; an unknown one
    is one line (UsageError)."""
    devices = [d.strip() for d in value.split(",") if d.strip()]
    bad = [d for d in devices if d not in ("cpu", "cuda")]
    if bad:
        raise UsageError(f"unknown device {bad[0]!r}; valid values: cpu, cuda")
    return devices


def _pep440(value: str, flag: str, example: str) -> None:
    """A version a flag names must be PEP 440; otherwise one line (UsageError)."""
    try:
        Version(value.strip())
    except InvalidVersion:
        raise UsageError(f"{flag} {value!r} is not a PEP 440 version (e.g. {example})") from None


def _diff(args: argparse.Namespace, entries: list[Any]) -> int:
    """`expectations diff`: the cells of the default matrices OLD claims otherwise than the file."""
    from ..verdict import diff

    devices = _matrix_devices(args.device)
    if not devices:
        raise UsageError(f"unknown device {args.device!r}; valid values: cpu, cuda")
    if args.torch is not None:
        _pep440(args.torch, "--torch", "2.11.0")
    old = expectations_mod.load(args.old)
    found = diff.claim_diff(old, entries, sorted(impls.registered()),
                            [case for device in devices for case in generate(device=device)],
                            diff.load_machine(args.machine), args.torch)
    for key, count in sorted(found.groups.items()):
        impl, device, before, after = key
        print(f"{count:5} {impl} ({device}): {before}  ->  {after}   e.g. {found.examples[key]}")
    print(f"{found.cells} cells of the default {'/'.join(devices)} matrices: "
          f"{found.changed} claimed differently" + ("" if found.changed else " (none)"))
    return 1 if found.changed else 0


def _audit(args: argparse.Namespace, entries: list[Any]) -> int:
    """`expectations audit`: the table of `verdict.audit` over every record of the files given."""
    from tabulate import tabulate

    from ..verdict import audit, diff

    if args.keep:
        if not args.keep.endswith(".jsonl.gz"):
            raise UsageError(f"--keep {args.keep}: the file's name must end in .jsonl.gz (it is written gzipped)")
        reporting.check_output_file(args.keep, "--keep")
    records = [record for location in args.results for record in report_cli.read_nonempty(location)]
    found = audit.audit(records, entries, diff.load_machine(args.machine).known if args.machine else None)
    if args.keep:
        text = "".join(json.dumps(audit.essentials(r), sort_keys=True) + "\n" for r in records)
        # mtime 0: the same records give the same bytes each time
        reporting.write_output_file(args.keep, gzip.compress(text.encode("utf-8"), mtime=0), "--keep")
    rows = found.rows()
    if rows:
        print(tabulate(rows, headers="keys", tablefmt="github"))
    if args.examples:
        lines = found.examples() + [f"new    {line}" for line in found.new]
        if lines:
            print("\n" + "\n".join(lines))
    apart = ", ".join(f"{n} {why}" for why, n in sorted(found.not_judged.items()))
    claimed = sum(row["claimed"] for row in rows)
    missed = sum(row["missed"] for row in rows)
    print(f"\n{found.records} records: {claimed} claimed by {sum(1 for r in rows if r['claimed'])} entries, "
          f"{found.wrong_claims} wrongly (stale or wrong); {missed} failures missed by an entry expecting them; "
          f"{len(found.new)} new failures no entry explains; {found.unclaimed_passes} passes no entry claims"
          + (f"; not judged: {apart}" if apart else ""))
    return 1 if found.wrong_claims else 0


COMMANDS: dict[str, Any] = {"list": cmd_list, "run": cmd_run, "repro": cmd_repro, "fuzz": cmd_fuzz,
                            "bench": cmd_bench, "module": cmd_module,
                            "expectations": cmd_expectations}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m harness`` and ``ckpt-harness``; returns the exit status."""
    args = _parser().parse_args(argv)
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
        sys.stderr.close()
        return 0
    except UsageError as exc:  # every bad-input error of the harness (harness.errors)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C while a command sets up (a run's own loop keeps what it judged)
        print(f"\n{stops.describe(stop)}: stopped before its results were written", file=sys.stderr)
        return stops.status(stop)


if __name__ == "__main__":
    sys.exit(main())
