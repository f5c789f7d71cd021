"""How far the harness is from the GPU's own limit (issue 42), for `python -m harness bench`.

* `kernel_ms_by_capture`: per capture mode, the GPU's own time per case, the sum of the device
  time of every kernel, copy and fill the case's runs put on the GPU (torch's profiler, CUDA
  activity), over one warm pass of the matrix.  Beside the wall time per case it says how much of
  a case the GPU is busy.
* `where_time_goes`: a profile (cProfile) of one warm pass in this process, its own time summed by
  what spends it (the program's workload, the impl's checkpoint, the oracles, ambient snapshots,
  judging, torch's C++ calls, waiting on the GPU, ...).
* `fuzz_figures`: the fuzzer's programs per second and their GPU time per program.

Nothing here asserts a time: these are figures for the report (`bench.render`).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..model.cases import Case, Device
from ..run.execution import Target, run_case
from ..run.runner import TORCH_DIR

HARNESS = str(Path(__file__).resolve().parents[1]) + os.sep

# What spends the time, by the harness's own file (relative to harness/), first match wins.
_HARNESS_PARTS = (
    (("run/workload.py", "model/"), "program: build and workload (sites, regions, tensors)"),
    (("run/capture.py",), "capture: warm-up, graphs, replays"),
    (("run/ambient.py",), "ambient snapshots"),
    (("run/streams.py", "check/streams.py"), "stream snapshots"),
    (("check/",), "oracles and records (mask copies, comparisons)"),
    (("checkpoint/", "impls/"), "the impl's checkpoint and tracker (harness side)"),
    (("verdict/", "results.py"), "judging (expectations, models)"),
    (("run/",), "runner (sessions, references, isolation)"),
    (("fronts/",), "front (bench loop)"),
)
WAITING = "waiting on the GPU (synchronize, copies to the host)"
TORCH_CPP = "torch C++ (op dispatch, autograd engine, kernel launches)"
TORCH_PY = "torch Python (autograd, checkpoint, graphs, profiler)"
OTHER = "Python and the rest"


def _part(filename: str, name: str) -> str:
    """Which of the profile's parts a function's own time belongs to."""
    if filename == "~":  # a built-in: cProfile names it, not its module
        if "synchronize" in name or name.startswith(("<method 'item'", "<method 'tolist'", "<method 'cpu'")):
            return WAITING
        return TORCH_CPP if "torch" in name or "Tensor" in name or "_C." in name else OTHER
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    if path.startswith(HARNESS):
        rel = path[len(HARNESS):]
        for prefixes, part in _HARNESS_PARTS:
            if rel.startswith(prefixes):
                return part
        return OTHER
    return TORCH_PY if path.startswith(TORCH_DIR) else OTHER


def where_time_goes(run_pass: Callable[[], int]) -> dict[str, Any]:
    """Profile one call of `run_pass` (a warm pass over the matrix; it returns how many cases it
    ran): own time (cProfile ``tottime``) summed by part, most first, each in seconds, its share
    and milliseconds per case.  The profiler's own overhead inflates the total; the shares are what
    to read."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        cases = run_pass()
    finally:
        profiler.disable()
    totals: dict[str, float] = defaultdict(float)
    for (filename, _, name), (_, _, own, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        totals[_part(filename, name)] += own
    whole = sum(totals.values()) or 1.0
    rows = [{"part": part, "seconds": round(s, 3), "share": f"{s / whole:.0%}",
             "ms_per_case": round(s * 1e3 / max(cases, 1), 2)}
            for part, s in sorted(totals.items(), key=lambda kv: -kv[1])]
    return {"cases": cases, "profiled_s": round(whole, 2), "parts": rows}


def device_ms(run: Callable[[], Any]) -> float | None:
    """Milliseconds the GPU spent on what `run()` put on it: the summed durations of the CUDA
    events torch's profiler saw (kernels, including those replayed from CUDA graphs, copies,
    fills); None where the profiler saw no device activity (no CUDA, or a build without it)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    spans = [event.time_range.elapsed_us() for event in prof.events() if event.device_type == DeviceType.CUDA]
    return sum(spans) / 1e3 if spans else None


KERNEL_SAMPLE = 24  # cases per capture mode under the profiler: its traces grow with every kernel


def kernel_ms_by_capture(target: Target, cases: Sequence[Case], entries: Sequence[Any],
                         sample: int = KERNEL_SAMPLE) -> dict[str, float | None]:
    """Per capture mode, the GPU's own milliseconds per case (`device_ms` over `sample` of that
    mode's cases, spread evenly over the matrix, run as `harness run` runs them, divided by their
    number); empty off CUDA.  (With the whole matrix under the profiler at once, a bench that took
    100 s before ran past 150 s on an H100: the trace to parse grows with every kernel.)"""
    if not cases or cases[0].device is not Device.CUDA:
        return {}
    out: dict[str, float | None] = {}
    for capture in dict.fromkeys(case.capture for case in cases):
        mine = [case for case in cases if case.capture is capture]
        chosen = mine[::max(1, len(mine) // sample)][:sample]
        total = device_ms(lambda: [run_case(target, case, entries) for case in chosen])
        out[capture.value] = None if total is None else round(total / len(chosen), 3)
    return out


def fuzz_figures(target: Target, device: str, entries: Sequence[Any], programs: int, seed: int = 4242
                 ) -> dict[str, Any]:
    """The fuzzer over `programs` generated programs (new failures only, going on after one, no
    example database, a fixed seed), twice: timed, then under the profiler for the GPU's time
    (the same programs: the seed fixes them).  Programs per second, those judged (neither
    unsupported nor skipped: `fuzz.FuzzResult.judged`) and judged per second, wall and GPU
    milliseconds per program run (shrinking steps included)."""
    from .fuzz import fuzz

    def one() -> Any:
        return fuzz(target, Device(device), entries, examples=programs, seed_value=seed, new_only=True,
                    keep_going=True, database=None)

    start = time.perf_counter()
    timed = one()
    wall = time.perf_counter() - start
    gpu = device_ms(one) if device == "cuda" else None
    return {"programs": timed.tried, "generated": timed.generated, "judged": timed.judged, "seconds": round(wall, 2),
            "programs_per_s": round(timed.tried / wall, 1) if wall else None,
            "judged_per_s": round(timed.judged / wall, 1) if wall else None,
            "wall_ms_per_program": round(wall * 1e3 / max(timed.tried, 1), 2),
            "kernel_ms_per_program": None if gpu is None else round(gpu / max(timed.tried, 1), 3)}
