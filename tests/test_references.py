"""One reference run per case and tracker kind (harness.run.references, issue 42)."""

import pytest

from harness import impls
from harness.impls.bundled import BundledAdapter
from harness.impls.negative import InertForkAdapter
from harness.model.cases import parse_case_id
from harness.results import Outcome
from harness.run.references import HARNESS_TRACKER, NO_TRACKER, REFERENCES, tracker_kind
from harness.run.runner import run

TRACKED = parse_case_id("nonreentrant-tracked-eager-flat-none-cpu")
DRAWS_BETWEEN = parse_case_id("reentrant-default-eager-flat-draws-cpu")  # neg-no-restore fails it


def _comparable(result) -> dict:
    data = result.record().to_json()
    for key in ("duration_s", "timings", "reference_runs"):
        data.pop(key, None)
    return data


def test_the_tracker_kind_says_whose_references_may_be_shared():
    class OwnTracker(BundledAdapter):
        def make_tracker(self, device):
            return super().make_tracker(device)

    class Declared(OwnTracker):
        tracker_kind = "own tracker v1"

    class NoTracker:
        name = "plain"

        def checkpoint(self, fn, *args, reentrant, tracker, **kwargs):
            return fn(*args, **kwargs)

    assert tracker_kind(impls.load("bundled")) == tracker_kind(impls.load("torch")) == HARNESS_TRACKER
    assert tracker_kind(OwnTracker()) is None  # its own make_tracker, nothing declared: its own references
    assert tracker_kind(Declared()) == "own tracker v1"
    assert tracker_kind(NoTracker()) == NO_TRACKER
    patched = BundledAdapter()
    patched.make_tracker = lambda device: None  # set on the instance: anything
    assert tracker_kind(patched) is None
    assert tracker_kind(impls.load("megatron")) != tracker_kind(impls.load("megatron-graphsafe"))
    assert tracker_kind(impls.load("deepspeed")) == tracker_kind(impls.load("deepspeed-partition"))


def test_impls_of_one_tracker_kind_share_the_reference_and_judge_as_alone():
    bundled, torch_impl, broken = impls.load("bundled"), impls.load("torch"), impls.load("neg-no-restore")
    alone = {}
    for impl in (bundled, torch_impl, broken):
        REFERENCES.clear()
        alone[impl.name] = run(DRAWS_BETWEEN, impl)
        assert alone[impl.name].reference_runs == 1
    REFERENCES.clear()
    shared = [run(DRAWS_BETWEEN, impl) for impl in (bundled, torch_impl, broken)]
    assert [r.reference_runs for r in shared] == [1, 0, 0]
    assert [_comparable(r) for r in shared] == [_comparable(alone[i.name]) for i in (bundled, torch_impl, broken)]
    # a shared reference cannot hide a broken checkpoint: the control still fails, as alone
    assert shared[2].outcome is Outcome.MISMATCH and shared[0].outcome is Outcome.PASS
    assert run(DRAWS_BETWEEN, bundled, timeline=True).reference_runs == 1  # a timeline needs its own reference


def test_a_reference_that_failed_its_check_is_not_kept():
    class DeclaredInert(InertForkAdapter):
        tracker_kind = "inert fork"  # shared, but its reference fails the check

    first, second = run(TRACKED, DeclaredInert()), run(TRACKED, DeclaredInert())
    assert first.outcome is second.outcome is Outcome.ERROR
    assert first.reference_runs == second.reference_runs == 1  # each made (and failed) its own


def test_the_cache_keeps_the_last_few_keys():
    from harness.run.references import Reference, ReferenceCache

    cache = ReferenceCache(size=2)
    for n in range(3):
        cache.put(("case", n), Reference(record=n))
    assert cache.get(("case", 0)) is None and cache.get(("case", 2)).record == 2
    cache.put(None, Reference(record="never"))
    assert cache.get(None) is None and len(cache.entries) == 2


@pytest.mark.parametrize("jobs", [[], ["--no-isolate"]])
def test_the_summary_line_counts_the_reference_runs(tmp_path, capsys, jobs):
    from harness.fronts.cli import main

    code = main(["run", "--impl", "bundled,torch", "--case", TRACKED.id, "--case",
                 "reentrant-default-eager-flat-none-cpu", "--report-dir", str(tmp_path), "-q", *jobs])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    assert "4 cases in" in out and "; 2 reference runs for the 4 cases that ran" in out
