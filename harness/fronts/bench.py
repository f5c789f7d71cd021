"""`python -m harness bench`: speed and memory of the harness, measured rather than asserted.

Reports, per capture mode: cases per second; the mean per-case time split into setup, reference
run, checkpointed run, comparison and reporting; the bare workload (the same reference and
checkpointed forward/backward with no harness bookkeeping: no mask copies, no stream snapshots, no
gradient copies, no oracles) and the ratio of harness time to it.  Also: device memory reserved
after 10 cases and after N cases (the matrix repeated), peak host RSS, and the wall time of the
default matrix from process start (`python -m harness run` in a fresh process).
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
from typing import Any

import torch

from ..model.cases import Case
from ..model.matrix import generate
from ..run.capture import execute
from ..run.execution import Target, run_case
from ..run.runner import RunSession, checkpointing
from ..run.streams import preserved_global_rng
from ..run.workload import Tensors

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


def _default_matrix_wall(impl_name: str, device: str) -> float:
    """Seconds for `python -m harness run` over the default matrix, from process start."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "harness", "run", "--impl", impl_name, "--device", device,
                        "--no-isolate", "-q", "--report-dir", tmp], check=False, capture_output=True)
        return time.perf_counter() - start


def bench(target: Target, device: str, total_cases: int, matrix_wall: bool = True) -> dict[str, Any]:
    """Run the benchmark; returns the figures as a JSON-able dict.  Cases run and are judged the
    way `harness run` runs them (`execution.run_case`), expectations included.  `matrix_wall`:
    also time the whole default matrix in a fresh process (None in the figures when not asked:
    ``bench --cases N`` runs N cases and nothing else)."""
    from ..verdict import expectations

    impl, impl_name = target.adapter, target.name
    entries = expectations.load()
    cases = list(generate(device=device))
    if device == "cuda":
        torch.cuda.init()
    for capture in {case.capture for case in cases}:  # first-use costs (imports, CUDA kernels) untimed
        run_case(target, next(c for c in cases if c.capture is capture), entries)
    per_capture: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    memory: dict[str, float | None] = {}
    done = 0
    first_pass = True
    while done < total_cases:
        for case in cases:
            start = time.perf_counter()
            case_run = run_case(target, case, entries)
            result = case_run.result
            json.dumps(case_run.record.to_json())  # what writing a record costs, without the file system
            spent = time.perf_counter() - start
            if first_pass:
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
            if done == 10:
                memory["reserved_after_10_MiB"] = _reserved_mib()
            if done >= total_cases:
                break
        first_pass = False
    memory[f"reserved_after_{done}_MiB"] = _reserved_mib()
    rows = []
    for capture, phases in per_capture.items():
        n = len(phases["total"])
        mean = {k: sum(v) / len(v) if v else 0.0 for k, v in phases.items()}
        rows.append({
            "capture": capture, "cases": n, "cases_per_s": round(n / sum(phases["total"]), 1),
            **{f"{k}_ms": round(mean[k] * 1e3, 2) for k in (*PHASES, "total", "bare")},
            "harness_over_bare": round(mean["ran"] / mean["bare"], 2) if mean["bare"] else None,
        })
    return {
        "impl": impl_name, "device": device, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none",
        "per_capture": rows, "memory": memory, "cases_run": done,
        "peak_host_rss_MiB": round(_peak_rss_mib(), 1),
        "default_matrix_wall_s_from_process_start":
            round(_default_matrix_wall(impl_name, device), 2) if matrix_wall else None,
    }


def render(figures: dict[str, Any]) -> str:
    """The figures as plain-text tables (tabulate)."""
    from tabulate import tabulate

    head = (f"benchmark: impl {figures['impl']} on {figures['device']} ({figures['gpu']}), torch {figures['torch']}, "
            f"{figures['cases_run']} cases")
    lines = [head, tabulate(figures["per_capture"], headers="keys", tablefmt="github"), ""]
    extra = {**{k: v for k, v in figures["memory"].items()},
             "peak_host_rss_MiB": figures["peak_host_rss_MiB"],
             "default_matrix_wall_s_from_process_start":
                 figures["default_matrix_wall_s_from_process_start"] or "not measured (--cases N)"}
    lines.append(tabulate(extra.items(), headers=["figure", "value"], tablefmt="github"))
    return "\n".join(lines)


def write_json(figures: dict[str, Any], path: "str | Path") -> None:
    Path(path).write_text(json.dumps(figures, indent=2) + "\n")
