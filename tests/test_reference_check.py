"""The reference run is checked before it is trusted (`harness.check.reference`), on synthetic records.

`check_reference` passes a reference that drew the way its case says, and raises a
`ReferenceCheckError` naming the impl when a tracked site did not switch streams (or also moved
the default generator), when a default-stream site did not advance the default generator, when
a mask is all-zero or all-one, and when a site drew nothing in an iteration.  A reference run
twice (the attention ops whose backward is not run-to-run reproducible) that differs is
`NotReproducible`, and the case is skipped with the difference.
"""

from __future__ import annotations

import re

import pytest
import torch

from harness.check.records import FORWARD, MaskLog, RunRecord
from harness.check.reference import ReferenceCheckError, check_reference
from harness.check.streams import StreamSnapshot
from harness.model.cases import parse_case_id
from harness.run.runner import NotReproducible, require_reproducible

SITE_STREAMS = {"s0": None, "s1": "tp"}  # s0 on the default generator, s1 on tracker stream tp
ITERATIONS = 2
IMPL = "fake-impl"
DEVICE = "cpu"
CASE = parse_case_id("nonreentrant-default-eager-sdpa_efficient.f16.small.positional.flat-none-cuda")


def make_reference() -> RunRecord:
    """A reference that drew as `SITE_STREAMS` says: per iteration one random 8x8 mask per site
    (from a private generator), s0 advancing only the default generator and s1 only its stream."""
    gen = torch.Generator().manual_seed(7)
    record = RunRecord(MaskLog())
    for it in range(ITERATIONS):
        record.log.start(it)
        for site, stream in SITE_STREAMS.items():
            record.log.record(site, torch.rand(8, 8, generator=gen) < 0.5)
            record.watch.add(site, default_moved=stream is None, stream_moved=stream is not None)
    return record


def run(record: RunRecord) -> None:
    check_reference(record, SITE_STREAMS, ITERATIONS, DEVICE, IMPL)


def fails_with(record: RunRecord, text: str) -> str:
    """Run the check, which must raise naming the impl and containing `text`; the message."""
    with pytest.raises(ReferenceCheckError, match=re.escape(text)) as info:
        run(record)
    message = str(info.value)
    assert message.startswith(f"reference check failed for impl {IMPL!r}: "), message
    return message


def set_watch(record: RunRecord, site: str, it: int, default_moved: bool, stream_moved: bool) -> None:
    """Overwrite what the watch saw for `site`'s draw in iteration `it`."""
    record.watch.seen[site][it] = (default_moved, stream_moved)


def test_good_reference_passes():
    run(make_reference())


def test_reference_check_error_is_a_runtime_error():
    assert issubclass(ReferenceCheckError, RuntimeError)


def test_tracked_site_that_did_not_move_its_stream():
    record = make_reference()
    set_watch(record, "s1", 1, default_moved=False, stream_moved=False)
    message = fails_with(record, "tracker fork('tp') did not switch streams: site s1 left 'tp' where it was")
    assert "default generator" not in message and "more)" not in message


def test_tracked_site_that_drew_from_the_default_generator():
    record = make_reference()
    set_watch(record, "s1", 0, default_moved=True, stream_moved=False)
    fails_with(record, "tracker fork('tp') did not switch streams: site s1 left 'tp' where it was "
                       "and drew from the default generator (cpu)")


def test_tracked_site_that_also_moved_the_default_generator():
    record = make_reference()
    set_watch(record, "s1", 0, default_moved=True, stream_moved=True)
    fails_with(record, "tracker fork('tp') did not switch streams: site s1 also advanced the default "
                       "generator (cpu)")


def test_default_site_that_did_not_advance_the_default_generator():
    record = make_reference()
    set_watch(record, "s0", 1, default_moved=False, stream_moved=False)
    fails_with(record, "site s0 on the default generator (cpu) did not advance it")


@pytest.mark.parametrize("fill, word", [(False, "zero"), (True, "one")])
def test_constant_mask(fill, word):
    record = make_reference()
    record.log.masks[(1, "s1", FORWARD)] = [torch.full((8, 8), fill)]
    fails_with(record, f"the mask of site s1 in iteration 1 is all-{word}")


def test_site_that_drew_nothing_in_an_iteration():
    record = make_reference()
    del record.log.masks[(1, "s0", FORWARD)]
    fails_with(record, "site s0 drew no mask in iteration 1")


def test_one_line_per_site_and_a_count_of_the_rest():
    """Two bad draws of one site are one problem; the first problem (in site order) is shown
    and the others are counted."""
    record = make_reference()
    for it in range(ITERATIONS):
        set_watch(record, "s1", it, default_moved=False, stream_moved=False)
    assert "more)" not in fails_with(record, "site s1 left 'tp'")
    set_watch(record, "s0", 0, default_moved=False, stream_moved=False)
    record.log.masks[(0, "s0", FORWARD)] = [torch.zeros(8, 8, dtype=torch.bool)]
    message = fails_with(record, "site s0 on the default generator (cpu) did not advance it")
    assert message.endswith("(+2 more)"), message  # s1's stream, s0's all-zero mask


def test_an_alias_that_does_not_share_its_stream():
    record = make_reference()
    record.alias_problem = "tracker alias 'shared-b' does not share the state of 'shared-a': ..."
    fails_with(record, "tracker alias 'shared-b' does not share the state of 'shared-a'")


# --- a reference that is not bit-reproducible ------------------------------------------------------


def _twice(change=None) -> tuple[RunRecord, RunRecord]:
    first, second = make_reference(), make_reference()
    for record in (first, second):
        record.grads = {it: {"input": torch.ones(4, 4)} for it in range(ITERATIONS)}
        record.streams = {it: StreamSnapshot({"cpu": torch.arange(2)}, ()) for it in range(ITERATIONS)}
    if change is not None:
        change(second)
    return first, second


def test_two_identical_reference_runs_are_accepted():
    require_reproducible(CASE, *_twice(), ["loss"], ITERATIONS)


@pytest.mark.parametrize("what, change", [
    ("gradient input iteration 1", lambda r: r.grads[1]["input"].view(-1)[3].add_(1e-6)),
    ("forward-mask s1 iteration 0", lambda r: r.log.masks[(0, "s1", FORWARD)][0].logical_not_()),
])
def test_a_reference_whose_second_run_differs_is_not_reproducible(what, change):
    with pytest.raises(NotReproducible, match=re.escape(f"({what}: Mismatched elements: ")):
        require_reproducible(CASE, *_twice(change), ["loss"], ITERATIONS)
