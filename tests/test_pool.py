"""Several isolated case workers at once (issue 26): the same records as one worker, faults still
recorded, a stop still stops, and the count of workers chosen and said.

No test here depends on how fast a loaded machine is: cases get a limit of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.fronts import cli, gpus, plugin
from harness.model.cases import parse_case_id
from harness.run.execution import load_targets
from harness.run.pool import CasePool
from harness.verdict import expectations

ROOT = Path(__file__).resolve().parent.parent
GENEROUS_S = 120
CASES = [parse_case_id(c) for c in (
    "reentrant-tracked-eager-flat-none-cpu", "nonreentrant-default-eager-flat-none-cpu",
    "reentrant-mixed-eager-nested-none-cpu", "nonreentrant-shared-eager-flat-none-cpu")]
# what depends on the worker that ran it: its clock, and whether a reference was already made there
DROPPED = ("duration_s", "timings", "env", "worker", "reference_runs")


def _comparable(record) -> dict:
    data = {k: v for k, v in record.to_json().items() if k not in DROPPED}
    data["error"] = re.sub(r"0x[0-9a-f]+", "0x...", data["error"])  # a crash quotes its thread's address
    return data


def _run_pool(slots, work, entries) -> dict:
    pool = CasePool(slots, GENEROUS_S)
    done: dict = {}
    try:
        pool.run(work, entries, lambda index, number, case_run: done.setdefault(index, (number, case_run.record)))
    finally:
        pool.close()
    return done


def test_two_workers_judge_every_case_as_one_does():
    sys.path.insert(0, str(ROOT / "tests"))  # faulty_adapters, for the worker processes too
    try:
        targets = load_targets(["bundled", "torch", "faulty_adapters:make_abort"])
    finally:
        sys.path.remove(str(ROOT / "tests"))
    entries = expectations.load()
    work = [(t, c) for t in targets for c in CASES]
    one = _run_pool([None], work, entries)
    two = _run_pool([None, None], work, entries)
    assert sorted(one) == sorted(two) == list(range(len(work)))
    assert {index: _comparable(r) for index, (_, r) in one.items()} == \
        {index: _comparable(r) for index, (_, r) in two.items()}
    assert {number for number, _ in two.values()} == {0, 1}  # both worked
    outcomes = {(r.impl, r.outcome.value) for _, r in two.values()}
    assert ("faulty_adapters:make_abort", "crash") in outcomes  # a crash is a result; the rest went on
    assert ("bundled", "pass") in outcomes and ("torch", "mismatch") in outcomes


def test_a_stop_in_the_caller_stops_the_workers_and_is_raised():
    [target] = load_targets(["bundled"])
    pool = CasePool([None, None], GENEROUS_S)
    seen = []

    def on_done(index, number, case_run):
        seen.append(index)
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run([(target, c) for c in CASES * 3], expectations.load(), on_done)
        assert len(seen) == 1
        assert all(w._process is None for w in pool.workers)  # the processes are gone
    finally:
        pool.close()


def test_a_worker_pinned_to_a_gpu_gets_it_in_its_environment():
    pool = CasePool(["3", None], GENEROUS_S)
    try:
        assert pool.workers[0].env == {"CUDA_VISIBLE_DEVICES": "3"}
        assert pool.workers[1].env == {}
    finally:
        pool.close()


def test_the_command_line_writes_the_same_report_with_two_workers(tmp_path):
    def run(jobs: str, report: Path) -> list[dict]:
        out = subprocess.run(
            [sys.executable, "-m", "harness", "run", "--device", "cpu", "--impl", "bundled,torch",
             "--case", CASES[0].id, "--case", CASES[1].id, "--case", CASES[2].id, "--jobs", jobs,
             "--report-dir", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"case workers: {jobs} (CPU cases)" in out.stdout
        return [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]

    one, two = run("1", tmp_path / "one"), run("2", tmp_path / "two")
    strip = lambda rows: sorted(({k: v for k, v in r.items() if k not in DROPPED} for r in rows),  # noqa: E731
                                key=lambda r: (r["impl"], r["case_id"]))
    assert strip(one) == strip(two)
    assert (tmp_path / "one" / "cases.csv").read_text().count("\n") == \
        (tmp_path / "two" / "cases.csv").read_text().count("\n")


# --- how many workers, and on which GPU -----------------------------------------------------------


def _args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"jobs": None, "workers_per_gpu": None, "isolate": True, "ranks": 1, "tp": 0, "cp": 1,
                                 **given})


def test_cpu_runs_default_to_one_worker_and_take_jobs():
    cpu = [parse_case_id("reentrant-tracked-eager-flat-none-cpu")]
    assert cli.worker_slots(_args(), cpu) == ([None], "case workers: 1 (CPU cases; --jobs N for more)")
    assert cli.worker_slots(_args(jobs=3), cpu)[0] == [None, None, None]
    with pytest.raises(UsageError, match="no selected case runs on CUDA"):
        cli.worker_slots(_args(workers_per_gpu=2), cpu)
    with pytest.raises(UsageError, match="at least 1"):
        cli.worker_slots(_args(jobs=0), cpu)
    with pytest.raises(UsageError, match="leave out --no-isolate"):
        cli.worker_slots(_args(jobs=2, isolate=False), cpu)
    assert cli.worker_slots(_args(isolate=False), cpu)[0] == []


def test_cuda_runs_spread_workers_over_the_visible_gpus(monkeypatch):
    cuda = [parse_case_id("reentrant-tracked-eager-flat-none-cuda")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setattr(gpus, "gpu_memory_bytes", lambda env=None: [80 << 30, 80 << 30])
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    slots, line = cli.worker_slots(_args(), cuda)
    assert slots == ["4", "6"] * 8 and "8 per GPU on 2 GPU(s)" in line
    assert cli.worker_slots(_args(workers_per_gpu=2), cuda)[0] == ["4", "6", "4", "6"]
    assert cli.worker_slots(_args(jobs=3), cuda)[0] == ["4", "6", "4"]


@pytest.mark.parametrize("gpu_count, cores, memory, expected", [
    (1, 16, [140 << 30], 8),  # the cap
    (1, 2, [140 << 30], 2),  # the cores
    (4, 16, [80 << 30] * 4, 4),  # the cores, shared among the GPUs
    (1, 64, [12 << 30], 3),  # the memory
    (1, 64, [], 8),  # memory unknown: cores and the cap
    (2, 1, [], 1),  # never none
])
def test_default_workers_per_gpu(gpu_count, cores, memory, expected):
    count, why = gpus.default_workers_per_gpu(gpu_count, cores, memory)
    assert count == expected and why


def test_plan_slots_interleaves_the_gpus():
    assert gpus.plan_slots(["0", "1"], 3) == ["0", "1", "0", "1", "0", "1"]
    with pytest.raises(ValueError):
        gpus.plan_slots(["0"], 0)


class _Config:
    invocation_params = type("Args", (), {"args": ("--harness-workers-per-gpu",)})  # what messages name

    def __init__(self, **options) -> None:
        self.options = {"workers_per_gpu": None, "device": "cuda", "ranks": 1, "tp": 0, "cp": 1, **options}

    def getoption(self, name):
        return self.options[name.removeprefix("harness_")]  # the plugin's dests are harness_<name>


def test_xdist_auto_starts_the_workers_per_gpu_on_cuda(monkeypatch):
    monkeypatch.setattr(plugin, "resolve_devices", lambda value: value.split(","))
    monkeypatch.setattr(gpus, "visible_gpus", lambda env=None: ["0", "1"])
    monkeypatch.setattr(gpus, "gpu_memory_bytes", lambda env=None: [140 << 30] * 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    config = _Config()
    assert plugin.pytest_xdist_auto_num_workers(config) == 8
    assert "4 per GPU on 2 GPU(s)" in plugin.pytest_report_header(config)
    assert plugin.pytest_xdist_auto_num_workers(_Config(workers_per_gpu=3)) == 6
    assert plugin.pytest_xdist_auto_num_workers(_Config(device="cpu")) is None  # xdist's own count


def test_xdist_workers_beyond_the_gpus_share_them(tmp_path):
    # gw0 and gw1 hold a GPU each; gw2 and gw3 share them round-robin (gpus.claim_gpu).
    claims = [gpus.claim_gpu(i, ["0", "1"], tmp_path) for i in range(4)]
    assert claims == [("0", True), ("1", True), ("0", False), ("1", False)]


def test_a_worker_started_early_runs_its_first_case_without_a_second_process():
    from harness.run.isolation import CaseWorker

    worker = CaseWorker(GENEROUS_S)
    try:
        worker.start()
        process = worker._process
        worker.start()  # already running: nothing new
        assert worker._process is process
        result = worker.run(CASES[0], "bundled", 2)
        assert result.outcome.value == "pass" and worker._process is process and worker.restarts == 0
    finally:
        worker.close()
