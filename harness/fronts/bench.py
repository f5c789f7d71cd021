"""`python -m harness bench`: speed and memory of the harness, measured rather than asserted.

Reports, per capture mode: cases per second; the mean per-case time split into setup, reference
run, checkpointed run, comparison and reporting; the bare workload (the same reference and
checkpointed forward/backward with no harness bookkeeping: no mask copies, no stream snapshots, no
gradient copies, no oracles) and the ratio of harness time to it.  Also: device memory reserved
after 10 cases and after N cases (the matrix repeated); after every pass over the matrix, device
memory reserved and allocated and the host's resident memory, and whether each stayed flat over the
second half of the run (`flatness`); peak host RSS; and the wall time of the default matrix from
process start (`python -m harness run` in a fresh process).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch

from .. import impls
from ..errors import UsageError
from ..model.cases import Case
from ..model.matrix import generate
from ..run.capture import execute
from ..run.execution import Target, run_case
from ..run.pool import CasePool
from ..run.runner import RunSession, checkpointing
from ..run.streams import preserved_global_rng
from ..run.workload import Tensors
from . import bench_limit, gpus

PHASES = ("setup", "reference", "checkpointed", "compare", "reporting")


class _BareSession(RunSession):
    """A run with the harness's bookkeeping switched off: what the workload itself costs."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.workload.record = lambda name, value: None  # no copies of RNG outputs
        self.workload.watch = None  # no reference check either

    def collect(self, iteration: int) -> None:
        pass


def bare_seconds(case: Case, impl: Any) -> float:
    """Wall time of the reference and the checkpointed run of `case` without bookkeeping."""
    device = torch.device(case.device.value)
    start = time.perf_counter()
    with preserved_global_rng():
        tensors = Tensors.make(case, device)
        for wrap in (None, checkpointing(impl, case)):
            execute(case.capture, _BareSession(case, device, tensors, impl.make_tracker, wrap), case.program.iterations)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _reserved_mib() -> float | None:
    return torch.cuda.memory_reserved() / 2**20 if torch.cuda.is_available() else None


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    """This process's resident memory now (Linux /proc; elsewhere the peak, the best there is)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return _peak_rss_mib()
    return pages * resource.getpagesize() / 2**20


def memory_now(passes: int, cases: int) -> dict[str, Any]:
    """One row of memory over time: device memory reserved and allocated (None without CUDA) and
    host RSS, in MiB, after `passes` passes over the matrix (`cases` cases)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {"pass": passes, "cases": cases,
            "reserved_MiB": round(torch.cuda.memory_reserved() / 2**20, 1) if cuda else None,
            "allocated_MiB": round(torch.cuda.memory_allocated() / 2**20, 1) if cuda else None,
            "host_rss_MiB": round(_rss_mib(), 1)}


FLAT_GROWTH = 0.10  # the bar: after 1000 and after 2000 cases within 10 %


def flatness(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per figure, whether memory stayed flat over the second half of the run: its value after the
    middle pass against after the last one (growth within `FLAT_GROWTH`).  Fewer than two passes
    say so rather than guess."""
    full = [row for row in rows if row["pass"] >= 1]
    if len(full) < 2:
        return {name: "not measured (fewer than two passes over the matrix)"
                for name in ("reserved_MiB", "allocated_MiB", "host_rss_MiB")}
    middle, last = full[(len(full) - 1) // 2], full[-1]
    verdicts = {}
    for name in ("reserved_MiB", "allocated_MiB", "host_rss_MiB"):
        before, after = middle[name], last[name]
        if before is None or after is None:
            verdicts[name] = "no CUDA"
            continue
        growth = (after - before) / before if before else (0.0 if after == before else float("inf"))
        word = "flat" if growth <= FLAT_GROWTH else "growing"
        verdicts[name] = (f"{word}: {before:g} after pass {middle['pass']} ({middle['cases']} cases), {after:g} after "
                          f"pass {last['pass']} ({last['cases']} cases), {growth:+.1%}")
    return verdicts


def _default_matrix_wall(impl_name: str, device: str) -> float:
    """Seconds for `python -m harness run` over the default matrix, from process start."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "harness", "run", "--impl", impl_name, "--device", device,
                        "--no-isolate", "-q", "--report-dir", tmp], check=False, capture_output=True)
        return time.perf_counter() - start


def bench(target: Target, device: str, total_cases: int, matrix_wall: bool = True,
          jobs: Sequence[int] = (), fuzz_programs: int = 0) -> dict[str, Any]:
    """Run the benchmark; returns the figures as a JSON-able dict.  Cases run and are judged the
    way `harness run` runs them (`execution.run_case`), expectations included.  `matrix_wall`:
    also time the whole default matrix in a fresh process (None in the figures when not asked:
    ``bench --cases N`` runs N cases and nothing else).  `jobs`: also the matrix's throughput with
    that many isolated case workers (`pool_throughput`).

    The per-case phases are those of the second pass over the matrix where the run has one (the
    first pass pays each program's first-use costs: kernels loaded, cuDNN and cuBLAS heuristics,
    allocator growth; its rate is `first_pass_cases_per_s`), else of the first, and say which.

    The limit (`bench_limit`): per capture mode the GPU's own time per case (``kernel_ms``) and
    the wall time over it; a profile of one more warm pass (where the time goes); with
    `fuzz_programs`, the fuzzer's programs per second and GPU time per program."""
    from ..verdict import expectations

    impl, impl_name = target.adapter, target.name
    entries = expectations.load_all(None, (), impls.registered())  # as `harness run` judges: packages' entries too
    cases = list(generate(device=device))
    if device == "cuda":
        torch.cuda.init()
    for capture in {case.capture for case in cases}:  # first-use costs (imports, CUDA kernels) untimed
        run_case(target, next(c for c in cases if c.capture is capture), entries)
    timed_pass = 2 if total_cases >= 2 * len(cases) else 1
    per_capture: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    memory: dict[str, float | None] = {}
    done = 0
    worked = 0  # cases that ran (pass or mismatch): a declared limit or a skip does no work to time
    first_reason = ""
    pass_seconds: list[float] = []
    by_pass = [memory_now(0, 0)]  # after the warm-up cases
    while done < total_cases:
        timing = len(by_pass) == timed_pass
        pass_start = time.perf_counter()
        for case in cases:
            start = time.perf_counter()
            case_run = run_case(target, case, entries)
            result = case_run.result
            json.dumps(case_run.record.to_json())  # what writing a record costs, without the file system
            spent = time.perf_counter() - start
            if timing:
                phases = per_capture[case.capture.value]
                for name in PHASES[:-1]:
                    phases[name].append(result.timings.get(name, 0.0))
                phases["reporting"].append(spent - result.duration_s)
                phases["total"].append(spent)
                # The bare workload only where the case really ran (not a declared limit, a skip
                # or an error: running those bare could take the process down with them).
                if result.outcome.value in ("pass", "mismatch"):
                    phases["bare"].append(bare_seconds(case, impl))
                    phases["ran"].append(spent)
            done += 1
            if result.outcome.value in ("pass", "mismatch"):
                worked += 1
            elif not first_reason:
                first_reason = f"{result.outcome.value}: {result.reason or result.error}"
            if done == 10:
                memory["reserved_after_10_MiB"] = _reserved_mib()
            if done >= total_cases:
                break
        pass_seconds.append(time.perf_counter() - pass_start)
        by_pass.append(memory_now(len(by_pass), done))  # a whole pass, or the part the total allowed
    memory[f"reserved_after_{done}_MiB"] = _reserved_mib()
    if not worked:  # a rate of cases that did not run is no figure
        raise UsageError(f"bench: none of the {done} cases ran under {impl_name} (e.g. {first_reason[:200]}): "
                         "there is nothing to time; pick an impl or --cases that run")
    # The limit's figures over the cases the bench ran (`--cases 3`: those three, not the matrix).
    ran = cases[:min(len(cases), total_cases)]
    kernel_error = None
    try:
        kernel = bench_limit.kernel_ms_by_capture(target, ran, entries)
    except Exception as exc:  # a profiler that cannot run here: the figure is missing, said so
        kernel, kernel_error = {}, f"{type(exc).__name__}: {exc}"[:200]
    profile = bench_limit.where_time_goes(lambda: len([run_case(target, case, entries) for case in ran]))
    rows = _capture_rows(per_capture, timed_pass, kernel)
    figures = {
        "impl": impl_name, "device": device, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none",
        "per_capture": rows, "memory": memory, "cases_run": done,
        "first_pass_cases_per_s": round(len(ran) / pass_seconds[0], 1),
        "memory_by_pass": by_pass, "memory_flat": flatness(by_pass),
        "peak_host_rss_MiB": round(_peak_rss_mib(), 1),
        "default_matrix_wall_s_from_process_start":
            round(_default_matrix_wall(impl_name, device), 2) if matrix_wall else None,
        "workers": [pool_throughput(target, cases, entries, n) for n in jobs],
        "profile": profile,
        "kernel_ms_not_measured": kernel_error,
        "fuzz": bench_limit.fuzz_figures(target, device, entries, fuzz_programs) if fuzz_programs else None,
    }
    figures["worker_overhead_ms"] = worker_overhead_ms(figures)
    figures["targets"] = against_targets(figures)
    return figures


def _capture_rows(per_capture: dict[str, dict[str, list[float]]], timed_pass: int,
                  kernel: dict[str, float]) -> list[dict[str, Any]]:
    """One row of figures per capture mode from the timed pass's phases: the rate of the cases
    that ran (None where none did), each phase's mean, harness over bare, and wall over kernel."""
    rows = []
    for capture, phases in per_capture.items():
        n = len(phases["total"])
        mean = {k: sum(v) / len(v) if v else 0.0 for k, v in phases.items()}
        rows.append({
            # the rate of the cases that ran: a declared limit costs nothing and would inflate it
            "capture": capture, "pass": timed_pass, "cases": n, "ran": len(phases["ran"]),
            "cases_per_s": round(len(phases["ran"]) / sum(phases["ran"]), 1) if phases["ran"] else None,
            # an impl that runs no case of a capture mode (all declared limits) has no bare time there
            **{f"{k}_ms": round(mean.get(k, 0.0) * 1e3, 2) for k in (*PHASES, "total", "bare")},
            "harness_over_bare": round(mean["ran"] / mean["bare"], 2) if mean.get("bare") else None,
            "kernel_ms": kernel.get(capture),
            "wall_over_kernel": round(mean["total"] * 1e3 / kernel[capture], 1) if kernel.get(capture) else None,
        })
    return rows


def pool_throughput(target: Target, cases: Sequence[Case], entries: Sequence[Any], count: int) -> dict[str, Any]:
    """The matrix's throughput with `count` isolated case workers (`run.pool.CasePool`, as
    ``harness run --jobs N`` runs it): the matrix twice over the same workers, the second pass
    timed (the first pays start-up and first-use costs), and whether every case's outcome and
    verdict in the timed pass equal those of the first (a worker sharing the GPU must not change
    one)."""
    work = [(target, case) for case in cases]
    pool = CasePool(gpus.pinned(cases[0].device.value, count))
    passes: list[dict[int, tuple[str, str]]] = []
    seconds: list[float] = []
    try:
        for _ in range(2):
            seen: dict[int, tuple[str, str]] = {}
            start = time.perf_counter()
            pool.run(work, entries, lambda index, _, done: seen.setdefault(
                index, (done.record.outcome.value, str(done.record.verdict))))
            seconds.append(time.perf_counter() - start)
            passes.append(seen)
    finally:
        pool.close()
    differ = sum(passes[0][i] != passes[1][i] for i in passes[0])
    return {"workers": count, "cases": len(work), "first_pass_s": round(seconds[0], 2),
            "timed_pass_s": round(seconds[1], 2), "cases_per_s": round(len(work) / seconds[1], 1),
            "verdicts_differ_between_passes": differ}


# The targets of issue 42 (H200) that the benchmark can measure itself.
TARGET_CASES_PER_S = 100.0  # one process
TARGET_WORKERS_CASES_PER_S = 300.0  # eight isolated workers
TARGET_HARNESS_OVER_BARE = 1.2
TARGET_FUZZ_PROGRAMS_PER_S = 50.0


def worker_overhead_ms(figures: dict[str, Any]) -> float | None:
    """What one isolated worker adds per case over running it in this process (the request and
    the result crossing the pipe, the record judged in the parent), in milliseconds: the
    one-worker pool's time per case less this process's; None without a one-worker figure."""
    one = next((row for row in figures["workers"] if row["workers"] == 1), None)
    rates = [r for r in figures["per_capture"] if r["cases_per_s"]]
    if one is None or not rates:
        return None
    here = sum(r["ran"] / r["cases_per_s"] for r in rates) / sum(r["ran"] for r in rates)
    return round((1 / one["cases_per_s"] - here) * 1e3, 2)


def against_targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured figure beside its target, and whether it is met."""
    rows = []
    best = max(figures["workers"], key=lambda row: row["cases_per_s"], default=None)
    rates = [r for r in figures["per_capture"] if r["cases_per_s"]]  # capture modes where a case ran
    single = sum(r["ran"] for r in rates) / sum(r["ran"] / r["cases_per_s"] for r in rates) if rates else None
    timed = rates[0]["pass"] if rates else "-"
    rows.append({"figure": f"cases/s, one process (pass {timed}; cases that ran)",
                 "measured": None if single is None else round(single, 1),
                 "target": f">= {TARGET_CASES_PER_S:g}",
                 "met": "-" if single is None else single >= TARGET_CASES_PER_S})
    if best is not None:
        rows.append({"figure": f"cases/s, {best['workers']} isolated workers", "measured": best["cases_per_s"],
                     "target": f">= {TARGET_WORKERS_CASES_PER_S:g} (8 workers)",
                     "met": best["cases_per_s"] >= TARGET_WORKERS_CASES_PER_S if best["workers"] >= 8 else "-"})
    for row in figures["per_capture"]:
        ratio = row["harness_over_bare"]
        rows.append({"figure": f"harness/bare, {row['capture']}", "measured": ratio,
                     "target": f"<= {TARGET_HARNESS_OVER_BARE:g}",
                     "met": "-" if ratio is None else ratio <= TARGET_HARNESS_OVER_BARE})  # none ran: no figure
    fuzz = figures.get("fuzz")
    if fuzz:
        rate = fuzz["programs_per_s"]
        rows.append({"figure": "fuzz programs/s, one search", "measured": rate,
                     "target": f">= {TARGET_FUZZ_PROGRAMS_PER_S:g} per GPU",
                     "met": "-" if rate is None else rate >= TARGET_FUZZ_PROGRAMS_PER_S})
    for name, verdict in figures["memory_flat"].items():
        measured = verdict.startswith(("flat", "growing"))
        rows.append({"figure": f"{name} over the second half",
                     "measured": verdict.split(",")[-1].strip() if measured else verdict,
                     "target": f"growth <= {FLAT_GROWTH:.0%}", "met": verdict.startswith("flat") if measured else "-"})
    return rows


def render(figures: dict[str, Any]) -> str:
    """The figures as plain-text tables (tabulate)."""
    from tabulate import tabulate

    head = (f"benchmark: impl {figures['impl']} on {figures['device']} ({figures['gpu']}), torch {figures['torch']}, "
            f"{figures['cases_run']} cases")
    timed = figures["per_capture"][0]["pass"] if figures["per_capture"] else "-"
    lines = [head, f"per case, in one process (pass {timed}; the first pass ran {figures['first_pass_cases_per_s']} "
                   "cases/s):",
             tabulate(figures["per_capture"], headers="keys", tablefmt="github"), ""]
    if figures["workers"]:
        lines += ["the matrix with N isolated case workers (second pass timed):",
                  tabulate(figures["workers"], headers="keys", tablefmt="github"), ""]
    if figures.get("worker_overhead_ms") is not None:
        lines += [f"an isolated worker adds {figures['worker_overhead_ms']} ms per case over this process (the pipe, "
                  "judging in the parent)", ""]
    profile = figures.get("profile")
    if profile:
        lines += [f"where a warm pass's time goes ({profile['cases']} cases, cProfile own time, "
                  f"{profile['profiled_s']} s under the profiler):",
                  tabulate(profile["parts"], headers="keys", tablefmt="github"), ""]
    if figures.get("fuzz"):
        lines += ["the fuzzer (one search, fixed seed, new failures only):",
                  tabulate([figures["fuzz"]], headers="keys", tablefmt="github"), ""]
    extra = {**{k: v for k, v in figures["memory"].items()},
             "peak_host_rss_MiB": figures["peak_host_rss_MiB"],
             **({"kernel_ms_not_measured": figures["kernel_ms_not_measured"]}
                if figures.get("kernel_ms_not_measured") else {}),
             "default_matrix_wall_s_from_process_start":
                 figures["default_matrix_wall_s_from_process_start"] or "not measured (--cases N)"}
    lines.append(tabulate(extra.items(), headers=["figure", "value"], tablefmt="github"))
    lines += ["", "memory after each pass over the matrix (pass 0: after the warm-up cases)",
              tabulate(figures["memory_by_pass"], headers="keys", tablefmt="github"), "",
              tabulate(figures["memory_flat"].items(), headers=["figure", "second half of the run"],
                       tablefmt="github"), "",
              "against the targets (issue 42):",
              tabulate(figures["targets"], headers="keys", tablefmt="github")]
    return "\n".join(lines)


def json_text(figures: dict[str, Any]) -> str:
    """The figures as the JSON text `bench --json` writes."""
    return json.dumps(figures, indent=2) + "\n"
