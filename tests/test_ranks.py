"""`--ranks N` (issue 41): cases run in a tensor-parallel group of processes on the CPU (gloo),
the cross-rank oracle, the controls only ranks catch, and what a dying or hanging rank becomes.
The slice is small on purpose: each launch starts two processes that import torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import impls
from harness.check.ranks import cross_rank
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.run.ranks import run_ranked

ROOT = Path(__file__).resolve().parent.parent
TRACKED = "nonreentrant-tracked-eager-flat-none-cpu"
MIXED = "reentrant-mixed-eager-nested-draws-cpu"
DEFAULT = "nonreentrant-default-eager-flat-none-cpu"
SHARED = "nonreentrant-shared-eager-siblings-none-cpu"
SLICE = [parse_case_id(c) for c in (TRACKED, MIXED, DEFAULT, SHARED)]


def ranked(impl: str, cases=SLICE, timeout: float = 120.0) -> dict[str, runner.CaseResult]:
    return {cases[i].id: result for i, result in run_ranked(impl, cases, 2, timeout)}


def test_cross_rank_oracle_fails_both_ways_and_on_a_missing_draw():
    per_tp = {"s0": "model-parallel-rng"}
    # per TP rank: must differ; the same on both ranks is a mismatch
    assert [m.oracle for m in cross_rank([{"0/s0/forward": "a"}, {"0/s0/forward": "a"}], per_tp)] == ["rank-streams"]
    assert cross_rank([{"0/s0/forward": "a"}, {"0/s0/forward": "b"}], per_tp) == []
    # seeded alike: must be equal; different is a mismatch
    assert cross_rank([{"0/s1/recompute": "a"}, {"0/s1/recompute": "a"}], per_tp) == []
    found = cross_rank([{"0/s1/recompute": "a"}, {"0/s1/recompute": "b"}], per_tp)
    assert [(m.subject, m.iteration) for m in found] == [("s1", 0)] and "rank 1" in found[0].detail
    # a rank that did not draw where another did
    assert "recorded no output" in cross_rank([{"0/s1/forward": "a"}, {}], per_tp)[0].detail


def test_a_correct_checkpoint_passes_every_rank_and_the_cross_rank_oracle():
    results = ranked("bundled")
    assert {r.outcome.value for r in results.values()} == {"pass"}, {k: r.summary() for k, r in results.items()}
    record = results[TRACKED].record().to_json()
    assert record["ranks"] == 2 and [p["rank"] for p in record["per_rank"]] == [0, 1]


def test_each_rank_is_judged_against_its_own_reference():
    results = ranked("torch", [parse_case_id(TRACKED), parse_case_id(DEFAULT)])
    tracked = results[TRACKED]
    assert tracked.outcome.value == "mismatch"
    assert {m.subject.rsplit("@", 1)[1] for m in tracked.mismatches if "@" in m.subject} == {"rank0", "rank1"}
    assert results[DEFAULT].outcome.value == "pass"


@pytest.mark.parametrize("control", ["neg-rank0-snapshot", "neg-rank-reseed"])
def test_a_control_only_ranks_catch(control):
    adapter = impls.load(control)
    for case in SLICE:  # one process is rank 0 of 1: the control is bundled
        assert runner.run(case, adapter).outcome.value == "pass", case.id
    results = ranked(control)
    for case_id in (TRACKED, MIXED):
        result = results[case_id]
        assert result.outcome.value == "mismatch", result.summary()
        oracles = {m.oracle for m in result.mismatches}
        assert {"rank-streams", "recompute-mask", "gradient"} <= oracles
        ranks_failing = [p["rank"] for p in result.per_rank if p["outcome"] != "pass"]
        assert ranks_failing == [1], result.per_rank  # rank 0 rewinds to its own state
        cross = next(m for m in result.mismatches if m.oracle == "rank-streams")
        assert "model-parallel-rng" in cross.detail and "must differ" in cross.detail
    # the streams every rank seeds alike hide it
    assert results[DEFAULT].outcome.value == "pass" and results[SHARED].outcome.value == "pass"


@pytest.fixture
def faulty_on_path(monkeypatch):
    here = str(ROOT / "tests")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(here)


def test_a_rank_that_dies_is_that_cases_crash_and_the_next_cases_still_run(faulty_on_path):
    cases = [parse_case_id(c) for c in ("nonreentrant-default-eager-flat-none-cpu",
                                        "nonreentrant-default-eager-nested-none-cpu",
                                        "nonreentrant-default-eager-siblings-none-cpu")]
    results = ranked("faulty_adapters:make_rank_one_dies", cases)
    outcomes = [results[c.id].outcome.value for c in cases]
    assert outcomes == ["pass", "crash", "pass"], [results[c.id].summary() for c in cases]
    crash = results[cases[1].id]
    assert "rank 1 (exit code 7) died while running it" in crash.error, crash.error
    assert [(p["rank"], p["outcome"]) for p in crash.per_rank] == [(0, "stopped"), (1, "crash")], crash.per_rank


def test_a_rank_that_hangs_is_that_cases_timeout_and_nothing_is_left_running(faulty_on_path):
    cases = [parse_case_id(c) for c in ("nonreentrant-default-eager-nested-none-cpu",
                                        "nonreentrant-default-eager-flat-none-cpu")]
    # The limit counts from when a rank starts the case: the hang is never reached by a slow start,
    # and the healthy case after it takes a fraction of a second of it even on a loaded machine.
    results = ranked("faulty_adapters:make_rank_one_hangs", cases, timeout=20.0)
    assert [results[c.id].outcome.value for c in cases] == ["timeout", "pass"]
    assert "every rank and the launcher were killed" in results[cases[0].id].error
    left = subprocess.run(["pgrep", "-f", "harness.run.rank_worker"], capture_output=True, text=True).stdout
    assert not left.strip(), f"rank processes left running: {left}"


def test_run_ranks_writes_records_that_say_the_rank_count(tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--impl", "neg-rank0-snapshot", "--device", "cpu",
                           "--case", TRACKED, "--ranks", "2", "--report-dir", str(out), "-q"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr  # xfail: the rank0-snapshot entry applies at 2 ranks
    record = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert record["ranks"] == 2 and record["verdict"] == "xfail" and record["expected_entry"] == "rank0-snapshot"
    assert record["per_rank"][1]["oracles"] == ["gradient", "recompute-mask"]


def test_pytest_ranks_runs_each_case_on_that_many_ranks(tmp_path):
    # the plugin's --ranks: the control is an xfail by its ranks = 2 entry, bundled passes
    done = subprocess.run([sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", "--impl",
                           "neg-rank0-snapshot,bundled", "--device", "cpu", "--program", "flat", "-k",
                           "nonreentrant-tracked-eager-flat-none", "--ranks", "2", "--report-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout and "1 xfailed" in done.stdout, done.stdout[-1000:]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {(r["impl"], r["verdict"], r["ranks"]) for r in lines} == {("neg-rank0-snapshot", "xfail", 2),
                                                                      ("bundled", "pass", 2)}


# --- layouts: TP x CP x DP (Megatron's order, TP fastest) --------------------------------------


def test_a_layout_places_each_rank_and_seeds_each_stream_by_its_axes():
    from harness import rank_context as rc

    places = [rc.RankContext(r, 8, 2, 2) for r in range(8)]
    assert [(p.tp_rank, p.cp_rank, p.dp_rank) for p in places[:5]] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0),
                                                                       (0, 0, 1)]
    assert places[0].label() == "tp2xcp2xdp2" and rc.RankContext(1, 2).label() == "tp2"
    assert rc.sizes("tp2xcp2xdp2") == {"tp": 2, "cp": 2, "dp": 2} and rc.sizes("tp4") == {"tp": 4, "cp": 1, "dp": 1}
    for stream, axes in rc.STREAM_AXES.items():
        for a in places:
            for b in places:
                same = all(a.coordinates()[axis] == b.coordinates()[axis] for axis in axes)
                assert (a.seed_offset(stream) == b.seed_offset(stream)) == same, (stream, a, b)
    assert {p.seed_offset("data-parallel-rng") for p in places} == {0}  # seeded alike everywhere
    assert "cannot be split" in rc.layout_problem(6, 4, 1) and rc.layout_problem(8, 2, 2) is None


def test_cross_rank_oracle_follows_the_layout_both_ways():
    # TP 2 x DP 2: ranks 0 and 2 hold TP rank 0, ranks 1 and 3 TP rank 1
    coords = [{"tp": r % 2, "cp": 0, "dp": r // 2} for r in range(4)]
    per_tp = {"s0": "model-parallel-rng"}
    right = [{"0/s0/forward": v} for v in "abab"]
    assert cross_rank(right, per_tp, coords) == []
    replicas_differ = cross_rank([{"0/s0/forward": v} for v in "abcb"], per_tp, coords)
    assert len(replicas_differ) == 1 and "ranks 0 and 2" in replicas_differ[0].detail
    assert "which they share: they must be equal" in replicas_differ[0].detail
    shards_alike = cross_rank([{"0/s0/forward": "a"} for _ in range(4)], per_tp, coords)
    assert len(shards_alike) == 1 and "must differ" in shards_alike[0].detail and shards_alike[0].count == 4
    # a context-parallel stream under TP 2 x CP 2: seeded by the CP rank only
    cp_coords = [{"tp": r % 2, "cp": r // 2, "dp": 0} for r in range(4)]
    per_cp = {"s1": "context-parallel-rng"}
    assert cross_rank([{"0/s1/recompute": v} for v in "aabb"], per_cp, cp_coords) == []
    assert "context-parallel rank" in cross_rank([{"0/s1/recompute": "a"} for _ in range(4)], per_cp,
                                                 cp_coords)[0].detail


CP_CASE = "nonreentrant-tracked-eager-(native_dropout@c+native_dropout@m+native_dropout)-none-cpu"


def test_four_ranks_in_tp2_by_cp2_catch_the_controls_on_every_stream_seeded_per_rank():
    case = parse_case_id(CP_CASE)
    for impl in ("bundled", "neg-rank-reseed"):
        [(_, result)] = list(run_ranked(impl, [case], 4, 120.0, tp=2, cp=2))
        assert result.rank_layout == "tp2xcp2xdp1" and result.ranks == 4
        if impl == "bundled":
            assert result.outcome.value == "pass", result.summary()
            continue
        assert [p["rank"] for p in result.per_rank if p["outcome"] != "pass"] == [1, 2, 3], result.per_rank
        crossed = {m.subject: m.detail for m in result.mismatches if m.oracle == "rank-streams"}
        assert set(crossed) == {"s0", "s1", "s2"}, crossed  # @c, @m, and the tracked stream
        assert "context-parallel-rng" in crossed["s0"] and "model-and-context-parallel-rng" in crossed["s1"]


def _context_parallel_cells(device: str = "cpu") -> list:
    """The default matrix's cases with a site on the context-parallel or model-and-context stream."""
    from harness.model.matrix import generate

    return [case for case in generate(device=device) if {"c", "m"} & set(case.streams().values())]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_default_matrix_draws_the_context_parallel_streams_in_both_modes_and_layouts(device):
    # Issue 57: under --cp 2 a checkpoint that groups ranks without regard to CP must change a
    # gradient somewhere in the default matrix, so both streams seeded per CP rank are drawn there.
    cells = _context_parallel_cells(device)
    drawn = {(case.mode.value, case.layout.value, code) for case in cells for code in case.streams().values()}
    assert {(mode, layout, code) for mode in ("reentrant", "nonreentrant") for layout in ("tracked", "mixed")
            for code in "cm"} <= drawn


def test_the_fuzzer_draws_sites_on_the_context_parallel_streams():
    from hypothesis import HealthCheck, find, settings

    from harness.fronts.fuzz import case_strategy
    from harness.model.cases import Device

    quick = settings(database=None, max_examples=2000, suppress_health_check=list(HealthCheck))
    for code in "cm":
        found = find(case_strategy(Device.CPU), lambda case, code=code: code in case.streams().values(),
                     settings=quick)
        assert found.layout.value in ("tracked", "mixed"), found.id


def test_four_ranks_in_tp2_by_cp2_catch_a_checkpoint_blind_to_context_parallelism_in_the_default_matrix():
    # neg-rank-cp-blind shares one snapshot across each CP group: right on every stream but the two
    # seeded per CP rank, so it passes every cell without them (the tracked one below) and fails
    # every default-matrix cell with them, on the ranks of CP rank 1 (2 and 3) only.
    cells = _context_parallel_cells()
    tracked = parse_case_id(TRACKED)
    results = dict(run_ranked("neg-rank-cp-blind", [*cells, tracked], 4, 120.0, tp=2, cp=2))
    assert results[len(cells)].outcome.value == "pass", results[len(cells)].summary()
    for index, case in enumerate(cells):
        result = results[index]
        assert result.outcome.value == "mismatch", (case.id, result.summary())
        assert {"recompute-mask", "gradient", "rank-streams"} <= {m.oracle for m in result.mismatches}, case.id
        assert [p["rank"] for p in result.per_rank if p["outcome"] != "pass"] == [2, 3], (case.id, result.per_rank)
    assert runner.run(cells[0], impls.load("neg-rank-cp-blind")).outcome.value == "pass"  # one process: bundled


def test_a_rank_group_keeps_one_launch_between_cases_and_replaces_a_dead_one(faulty_on_path):
    from harness.run.ranks import RankGroup

    flat, nested = (parse_case_id(c) for c in ("nonreentrant-default-eager-flat-none-cpu",
                                               "nonreentrant-default-eager-nested-none-cpu"))
    with RankGroup(2, 120.0) as group:
        assert group.run(flat, "bundled").outcome.value == "pass"
        first = group._launch.process.pid
        assert group.run(nested, "bundled").outcome.value == "pass"
        assert group._launch.process.pid == first and group.restarts == 0  # one launch, two cases
        assert group.run(nested, "faulty_adapters:make_rank_one_dies").outcome.value == "crash"
        assert group.restarts == 1
        assert group.run(flat, "faulty_adapters:make_rank_one_dies").outcome.value == "pass"  # a new launch


def test_fuzz_ranks_judges_every_program_on_every_rank(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "fuzz", "--impl", "neg-rank0-snapshot", "--device", "cpu",
                           "--ranks", "2", "--examples", "12", "--seed", "3", "--no-database", "--new-only",
                           "--report-dir", str(tmp_path / "fuzz")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "on 2 ranks (tp2)" in done.stdout and "no new failure" in done.stdout, done.stdout[-1500:]
    records = [json.loads(line) for line in (tmp_path / "fuzz" / "results.jsonl").read_text().splitlines()]
    assert records and all(r["ranks"] == 2 and r["rank_layout"] == "tp2" for r in records)
    assert any(r["verdict"] == "xfail" and r["expected_entry"] == "rank0-snapshot" for r in records)


@pytest.mark.parametrize("argv, message", [
    (["run", "--impl", "bundled", "--device", "cpu", "--ranks", "3", "--tp", "2"], "cannot be split"),
    (["run", "--impl", "bundled", "--device", "cpu", "--tp", "2"], "give --ranks too"),
    (["fuzz", "--impl", "bundled", "--device", "cpu", "--ranks", "2", "--jobs", "2"], "leave out --jobs"),
])
def test_a_layout_that_cannot_be_is_one_clear_line(argv, message):
    done = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_rank_zero_rewind_model_follows_the_streams_the_layout_seeds_per_rank():
    from harness.verdict.models import Machine, Model, predict

    model = [Model("rank-zero-rewind")]

    def said(case_id: str, layout: str):
        return predict(model, parse_case_id(case_id), Machine({"ranks.layout": layout}, probe=False))

    tracked = said(TRACKED, "tp2")
    assert tracked.outcome == "mismatch" and set(tracked.oracles) == {"recompute-mask", "gradient", "rank-streams"}
    assert said(DEFAULT, "tp2").outcome == "pass"  # no site draws from a stream seeded per rank
    # a context-parallel site fails only where CP > 1; F.dropout records its output: no rank-streams claim
    cp_only = "nonreentrant-tracked-eager-(native_dropout@c)-none-cpu"
    assert said(cp_only, "tp2").outcome == "pass"
    assert said(cp_only, "tp2xcp2xdp1").outcome == "mismatch"
    output_site = said("nonreentrant-tracked-eager-(dropout)-none-cpu", "tp2")
    assert output_site.outcome == "mismatch" and "rank-streams" not in output_site.oracles
