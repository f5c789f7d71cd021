"""Every oracle (`harness.check.oracles`) can fail: synthetic run records, no checkpoint, no runner.

`make_pair` builds a reference and a checkpointed `RunRecord` by hand (sites s0 and s1, outputs
r0 and loss, two iterations) that pass every oracle.  Each test breaks one thing in that pair and
asserts exactly which `Mismatch`es come back (oracle, subject, iteration, count, first index,
values), so a broken oracle that stays silent, or one that fires for the wrong reason, or one
that drags another oracle along, fails here.
"""

from __future__ import annotations

import pytest
import torch

from harness.check.compare import Mismatch
from harness.check.oracles import (
    ORACLES,
    Checks,
    RunRecord,
    ambient_state,
    buffers,
    check,
    forward_masks,
    fresh_randomness,
    gradients,
    identity,
    live_streams,
    outputs,
    recompute_masks,
)
from harness.check.records import CAPTURE, FORWARD, LOSS, RECOMPUTE, MaskLog
from harness.check.streams import StreamSnapshot, describe_state

SITES = ["s0", "s1"]
OUTPUTS = ["r0", LOSS]
ITERATIONS = 2
TRACKER = "tracker:tp"
ALIASES = (("tp", "tp-alias"),)
TRACKER_SEED = 2718


# ----------------------------------------------------------------------------------- helpers


def _gen(seed: int) -> torch.Generator:
    """A private generator: nothing here touches the global RNG."""
    return torch.Generator().manual_seed(seed)


def _mask(it: int, site: str) -> torch.Tensor:
    """The bool mask of `site` in iteration `it` (a different one for every pair)."""
    return torch.rand(8, 8, generator=_gen(100 * it + SITES.index(site))) < 0.5


def _floats(seed: int, shape: tuple[int, ...] = (4, 4)) -> torch.Tensor:
    return torch.rand(shape, generator=_gen(seed))


def philox_state(seed: int, offset: int) -> torch.Tensor:
    """A CUDA-like generator state: 16 bytes, read as int64 [seed, offset]."""
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


def nan_with_bits(bits: int) -> torch.Tensor:
    """A 1-element float32 tensor holding the NaN with the given bit pattern."""
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32)


def make_record(checkpointed: bool) -> RunRecord:
    """One run of the synthetic case, every tensor freshly made (the two runs share nothing).

    Forward masks of s0 and s1, the output of region r0 and the loss per iteration; the
    checkpointed run also recomputes each site once, redrawing its forward mask.  Gradients
    are ``input`` and ``weight.s0`` (which holds an exact +0.0 at [0, 0]); buffers a running mean
    and a counter, as BatchNorm keeps; streams are a CPU
    state and a Philox-like tracker stream with one alias; every tracker name resolves to the
    same object before and after each iteration.
    """
    log = MaskLog()
    tracker_object = torch.Generator()
    record = RunRecord(log, objects_before={TRACKER: tracker_object})
    for it in range(ITERATIONS):
        log.start(it)
        for site in SITES:
            log.record(site, _mask(it, site))
        log.record("r0", _floats(10 + it))
        log.record(LOSS, _floats(20 + it, ()))
        if checkpointed:
            log.phase = RECOMPUTE
            for site in SITES:
                log.record(site, _mask(it, site))
        weight_grad = _floats(30 + it)
        weight_grad[0, 0] = 0.0
        record.grads[it] = {"input": _floats(40 + it), "weight.s0": weight_grad}
        record.buffers[it] = {"norm.running_mean": _floats(50 + it, (4,)),
                              "norm.num_batches_tracked": torch.tensor(it + 1)}
        cpu = _gen(1234)
        torch.rand(it + 1, generator=cpu)
        record.streams[it] = StreamSnapshot(
            {"cpu": cpu.get_state(), TRACKER: philox_state(TRACKER_SEED, 16 * (it + 1))}, ALIASES,
        )
        record.objects[it] = {TRACKER: tracker_object}
        record.ambient[it] = [(point, dict(AMBIENT)) for point in AMBIENT_POINTS]
    return record


# The ambient state a run read at each point (a few pieces of `harness.run.ambient.snapshot`).
AMBIENT = {"sdpa flash enabled": True, "sdpa math enabled": True, "default dtype": torch.float32,
           "autocast cpu enabled": False}
AMBIENT_POINTS = ("after r0 forward", "in backward, after r0's recompute", "after backward")


def make_pair() -> tuple[RunRecord, RunRecord]:
    """A reference and a checkpointed record that pass every oracle."""
    return make_record(checkpointed=False), make_record(checkpointed=True)


def run_check(ref: RunRecord, ck: RunRecord) -> list[Mismatch]:
    return check(ref, ck, SITES, ITERATIONS, OUTPUTS)


def one(mismatches: list[Mismatch], oracle: str, subject: str, iteration: int) -> Mismatch:
    """The only mismatch of the list, which must be `oracle` about `subject` in `iteration`."""
    assert [(m.oracle, m.subject, m.iteration) for m in mismatches] == [(oracle, subject, iteration)], \
        [m.message() for m in mismatches]
    return mismatches[0]


def flip(tensor: torch.Tensor, index: tuple[int, ...]) -> None:
    """Flip one element of a bool mask, in place."""
    tensor[index] = ~tensor[index]


def set_mask(record: RunRecord, it: int, site: str, mask: torch.Tensor) -> None:
    """Replace a site's forward mask and (if recorded) its recompute, so the run stays
    self-consistent and only the comparison with the other run can notice."""
    record.log.masks[(it, site, FORWARD)] = [mask]
    if (it, site, RECOMPUTE) in record.log.masks:
        record.log.masks[(it, site, RECOMPUTE)] = [mask.clone()]


# ------------------------------------------------------------------------------- passing pair


# Each oracle on its own, applied over every iteration of the pair.
SINGLE_ORACLES = {
    "forward-mask": lambda ref, ck, it, c: forward_masks(ref, ck, SITES, it, c, OUTPUTS),
    "recompute-mask": lambda ref, ck, it, c: recompute_masks(ck, SITES, it, c),
    "gradient": lambda ref, ck, it, c: gradients(ref, ck, it, c),
    "buffer": lambda ref, ck, it, c: buffers(ref, ck, it, c),
    "live-stream": lambda ref, ck, it, c: live_streams(ref, ck, it, c),
    "fresh-randomness": lambda ref, ck, it, c: fresh_randomness(ref, ck, SITES, ITERATIONS, c) if it == 0 else None,
    "output": lambda ref, ck, it, c: outputs(ref, ck, OUTPUTS, it, c),
    "identity": lambda ref, ck, it, c: identity(ck, it, c),
    "ambient": lambda ref, ck, it, c: ambient_state(ref, ck, c) if it == 0 else None,
}


def test_every_oracle_is_covered():
    # rank-streams compares the ranks of a group, not a pair of runs: tests/test_ranks.py covers it
    assert set(SINGLE_ORACLES) == set(ORACLES) - {"rank-streams"}


@pytest.mark.parametrize("oracle", list(SINGLE_ORACLES))
def test_each_oracle_passes_the_good_pair(oracle):
    ref, ck = make_pair()
    checks = Checks()
    for it in range(ITERATIONS):
        SINGLE_ORACLES[oracle](ref, ck, it, checks)
    assert checks.resolve() == []


def test_the_good_pair_passes_check():
    assert run_check(*make_pair()) == []


def test_the_good_pair_is_not_trivial():
    """The masks really are random and really change between iterations and sites."""
    ref, _ = make_pair()
    masks = [ref.draws(it, site, FORWARD)[0] for it in range(ITERATIONS) for site in SITES]
    assert all(m.dtype == torch.bool and m.any() and not m.all() for m in masks)
    assert len({tuple(m.reshape(-1).tolist()) for m in masks}) == len(masks)


# ------------------------------------------------------------------------------ forward-mask


def test_forward_mask_one_flipped_element():
    ref, ck = make_pair()
    mask = ck.draws(1, "s1", FORWARD)[0].clone()
    flip(mask, (2, 5))
    set_mask(ck, 1, "s1", mask)
    m = one(run_check(ref, ck), "forward-mask", "s1", 1)
    assert (m.count, m.total, m.first_index) == (1, 64, (2, 5))
    assert m.got == str(bool(mask[2, 5]))
    assert m.expected == str(not bool(mask[2, 5]))
    assert "Mismatched elements: 1 / 64" in m.message()


def test_forward_mask_site_missing_in_checkpointed_run():
    ref, ck = make_pair()
    del ck.log.masks[(0, "s1", FORWARD)]  # its recompute stays: only the forward is missing
    m = one(run_check(ref, ck), "forward-mask", "s1", 0)
    assert (m.count, m.detail) == (0, "0 forward draws, expected 1")


def test_forward_mask_extra_site_only_in_checkpointed_run():
    ref, ck = make_pair()
    ck.log.masks[(0, "s9", FORWARD)] = [_mask(0, "s0")]
    m = one(run_check(ref, ck), "forward-mask", "s9", 0)
    assert m.detail == "1 forward draws, expected 0"


def test_forward_mask_two_draws_instead_of_one():
    ref, ck = make_pair()
    ck.log.masks[(1, "s0", FORWARD)].append(_mask(1, "s1"))
    m = one(run_check(ref, ck), "forward-mask", "s0", 1)
    assert (m.count, m.detail) == (0, "2 forward draws, expected 1")


# ---------------------------------------------------------------------------- recompute-mask


def test_recompute_mask_differs_from_forward():
    ref, ck = make_pair()
    flip(ck.log.masks[(0, "s0", RECOMPUTE)][0], (7, 7))
    m = one(run_check(ref, ck), "recompute-mask", "s0", 0)
    assert (m.count, m.total, m.first_index) == (1, 64, (7, 7))


def test_recompute_mask_site_never_recomputed():
    ref, ck = make_pair()
    del ck.log.masks[(1, "s1", RECOMPUTE)]
    m = one(run_check(ref, ck), "recompute-mask", "s1", 1)
    assert m.detail == "the site was never recomputed"


def test_recompute_mask_a_site_drawn_in_a_save_region_need_not_be_recomputed():
    # torch_remat's SAVE regions keep their activations: a draw there is not rerun by design
    ref, ck = make_pair()
    del ck.log.masks[(1, "s1", RECOMPUTE)]
    ck.log.saved.add((1, "s1"))  # as MaskLog.mark_saved files it
    assert [m for m in run_check(ref, ck) if m.oracle == "recompute-mask"] == []
    # but a saved site that is rerun is compared like any other
    flip(ck.log.masks[(0, "s0", RECOMPUTE)][0], (1, 1))
    ck.log.saved.add((0, "s0"))
    assert one(run_check(ref, ck), "recompute-mask", "s0", 0).count == 1


def test_a_save_region_draw_marked_while_capturing_counts_for_every_replay():
    # under capture the forward runs once, into the graph; each replay is filed by harvest(it),
    # and the SAVE marks must follow, or every replay's kept draw reads as "never recomputed"
    log = MaskLog()
    log.start(CAPTURE)
    log.record("s0", torch.ones(2))
    log.mark_saved("s0")
    log.phase = RECOMPUTE
    log.mark_saved("s1")  # only a forward draw is kept
    for it in (0, 1):
        log.harvest(it)
    assert log.saved == {(0, "s0"), (1, "s0")}
    log.start(CAPTURE)  # a new capture starts with nothing marked
    log.harvest(2)
    assert (2, "s0") not in log.saved


def test_recompute_mask_second_of_two_recomputes_differs():
    ref, ck = make_pair()
    second = _mask(0, "s0")
    flip(second, (0, 3))
    ck.log.masks[(0, "s0", RECOMPUTE)].append(second)
    m = one(run_check(ref, ck), "recompute-mask", "s0 (recompute 2 of 2)", 0)
    assert (m.count, m.first_index) == (1, (0, 3))


def test_recompute_mask_a_site_drawn_twice_per_forward_is_recomputed_in_order():
    ref, ck = make_pair()
    for record in (ref, ck):  # the site draws twice in each forward, and is recomputed so
        twice = [_mask(0, "s0"), _mask(1, "s1")]
        record.log.masks[(0, "s0", FORWARD)] = [t.clone() for t in twice]
        if record is ck:
            record.log.masks[(0, "s0", RECOMPUTE)] = [t.clone() for t in twice]
    assert run_check(ref, ck) == []
    flip(ck.log.masks[(0, "s0", RECOMPUTE)][1], (1, 1))
    m = one(run_check(ref, ck), "recompute-mask", "s0 (recompute 2 of 2)", 0)
    assert (m.count, m.first_index) == (1, (1, 1))


def test_recompute_mask_a_draw_only_in_the_recompute():
    ref, ck = make_pair()
    ck.log.masks[(0, "s9", RECOMPUTE)] = [_mask(0, "s0")]
    m = one(run_check(ref, ck), "recompute-mask", "s9", 0)
    assert m.detail == "drawn in a recompute but never in the forward"


# ---------------------------------------------------------------------------------- gradient


def test_gradient_signed_zero_is_a_difference():
    ref, ck = make_pair()
    ck.grads[0]["weight.s0"][0, 0] = -0.0
    m = one(run_check(ref, ck), "gradient", "weight.s0", 0)
    assert (m.count, m.total, m.first_index) == (1, 16, (0, 0))
    assert (m.got, m.expected) == ("-0.0 (0x80000000)", "0.0 (0x00000000)")


def test_gradient_extra_key_only_in_checkpointed_run():
    ref, ck = make_pair()
    ck.grads[1]["weight.s1"] = _floats(50)
    m = one(run_check(ref, ck), "gradient", "weight.s1", 1)
    assert m.detail == "no such gradient in the reference run"


def test_gradient_key_missing_in_checkpointed_run():
    ref, ck = make_pair()
    del ck.grads[0]["input"]
    m = one(run_check(ref, ck), "gradient", "input", 0)
    assert m.detail == "no such gradient in the checkpointed run"


@pytest.mark.parametrize("none_in, missing", [("ck", "checkpointed run"), ("ref", "reference run")])
def test_gradient_none_against_a_tensor(none_in, missing):
    ref, ck = make_pair()
    (ck if none_in == "ck" else ref).grads[1]["input"] = None
    m = one(run_check(ref, ck), "gradient", "input", 1)
    assert m.detail == f"no gradient in the {missing}"


def test_gradient_none_in_both_runs_passes():
    ref, ck = make_pair()
    ref.grads[0]["input"] = ck.grads[0]["input"] = None
    assert run_check(ref, ck) == []


@pytest.mark.parametrize("change, detail", [
    (lambda g: g.double(), "got torch.float64(4, 4), expected torch.float32(4, 4)"),
    (lambda g: g.reshape(16), "got torch.float32(16,), expected torch.float32(4, 4)"),
])
def test_gradient_dtype_or_shape_differs(change, detail):
    ref, ck = make_pair()
    ck.grads[0]["input"] = change(ck.grads[0]["input"])  # same values, other dtype or shape
    m = one(run_check(ref, ck), "gradient", "input", 0)
    assert (m.count, m.total, m.detail) == (16, 16, detail)


# ------------------------------------------------------------------------------- NaN payloads


def _nan_pair(ref_bits: int, ck_bits: int) -> tuple[RunRecord, RunRecord]:
    """The good pair with a NaN of the given bit patterns at input gradient [1, 2]."""
    ref, ck = make_pair()
    ref.grads[0]["input"][1, 2] = nan_with_bits(ref_bits)
    ck.grads[0]["input"][1, 2] = nan_with_bits(ck_bits)
    return ref, ck


def test_nan_payloads_that_differ_mismatch():
    m = one(run_check(*_nan_pair(0x7FC00000, 0x7FC00001)), "gradient", "input", 0)
    assert (m.count, m.first_index) == (1, (1, 2))
    assert (m.got, m.expected) == ("nan (0x7fc00001)", "nan (0x7fc00000)")


@pytest.mark.parametrize("bits", [0x7FC00000, 0x7FC00001, 0xFFC00123 - (1 << 32)])
def test_nan_payloads_with_equal_bits_match(bits):
    ref, ck = _nan_pair(bits, bits)
    assert torch.isnan(ck.grads[0]["input"][1, 2])
    assert run_check(ref, ck) == []


# ------------------------------------------------------------------------------- live-stream


@pytest.mark.parametrize("seed, offset, part", [(TRACKER_SEED, 48, "offset"), (99, 16, "seed")])
def test_live_stream_tracker_state_differs(seed, offset, part):
    ref, ck = make_pair()
    ck.streams[0].states[TRACKER] = philox_state(seed, offset)
    m = one(run_check(ref, ck), "live-stream", TRACKER, 0)
    assert m.got == f"seed {seed}, offset {offset}"
    assert m.expected == f"seed {TRACKER_SEED}, offset 16"
    assert m.detail == f"the Philox {part} differs"
    assert m.first_index == {"seed": 0, "offset": 1}[part]


def test_live_stream_cpu_state_differs():
    ref, ck = make_pair()
    ck.streams[1].states["cpu"] = ref.streams[0].states["cpu"].clone()  # one draw fewer
    m = one(run_check(ref, ck), "live-stream", "cpu", 1)
    assert m.got == describe_state(ref.streams[0].states["cpu"])
    assert m.expected == describe_state(ref.streams[1].states["cpu"])
    assert m.got.startswith("seed 1234, position ") and m.got != m.expected


@pytest.mark.parametrize("missing_in", ["checkpointed run", "reference run"])
def test_live_stream_missing_in_one_run(missing_in):
    ref, ck = make_pair()
    del (ck if missing_in == "checkpointed run" else ref).streams[1].states[TRACKER]
    m = one(run_check(ref, ck), "live-stream", TRACKER, 1)
    assert m.detail == f"missing in {missing_in}"


def test_live_stream_broken_alias_group():
    ref, ck = make_pair()
    ck.streams[0].alias_groups = ()
    m = one(run_check(ref, ck), "live-stream", "tracker aliases", 0)
    assert m.detail == f"alias groups (), expected {ALIASES}"


# -------------------------------------------------------------------------- fresh-randomness


def test_fresh_randomness_stale_mask_in_next_iteration():
    ref, ck = make_pair()
    for record in (ref, ck):  # both runs stale, so only this oracle can see it
        set_mask(record, 1, "s0", record.draws(0, "s0", FORWARD)[0].clone())
    m = one(run_check(ref, ck), "fresh-randomness", "s0", 1)
    assert m.detail == "forward mask is identical to iteration 0's (stale RNG)"


def test_fresh_randomness_stale_only_in_checkpointed_run_also_fails_forward_mask():
    ref, ck = make_pair()
    set_mask(ck, 1, "s0", ck.draws(0, "s0", FORWARD)[0].clone())
    assert [(m.oracle, m.subject, m.iteration) for m in run_check(ref, ck)] == [
        ("forward-mask", "s0", 1), ("fresh-randomness", "s0", 1),
    ]


def test_fresh_randomness_a_small_mask_the_reference_repeated_too_is_chance():
    # Drop-path's per-sample mask at batch 4: 0/1 values, mostly ones, repeats by chance.
    ref, ck = make_pair()
    for record in (ref, ck):
        for it in range(ITERATIONS):
            set_mask(record, it, "s0", torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert run_check(ref, ck) == []


def test_fresh_randomness_a_small_mask_repeated_only_in_the_checkpointed_run_is_stale():
    ref, ck = make_pair()
    for it in range(ITERATIONS):
        set_mask(ref, it, "s0", torch.tensor([1.0, 1.0, 1.0, float(it)]))
        set_mask(ck, it, "s0", torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert [(m.oracle, m.subject, m.iteration) for m in run_check(ref, ck)] == [
        ("forward-mask", "s0", 0), ("fresh-randomness", "s0", 1),
    ]


def test_fresh_randomness_a_random_scalar_repeated_in_both_runs_is_stale():
    # A float draw (layer drop's torch.rand([])) never repeats by chance, however small.
    ref, ck = make_pair()
    for record in (ref, ck):
        for it in range(ITERATIONS):
            set_mask(record, it, "s0", torch.tensor([0.37]))
    one(run_check(ref, ck), "fresh-randomness", "s0", 1)


def test_repeat_chance():
    from harness.check.compare import repeat_chance

    ones = torch.ones(4)
    assert repeat_chance(ones, ones) == 1.0
    assert repeat_chance(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])) == 0.25  # p = 1/2: (1/2)^2
    big = torch.rand(64, 64, generator=_gen(5)) < 0.5
    assert repeat_chance(big, big) < 1e-300
    assert repeat_chance(torch.tensor([0.37]), torch.tensor([0.37])) == 0.0


# ------------------------------------------------------------------------- per-iteration sites


def test_sites_per_iteration_a_site_the_reference_skipped_need_not_be_recomputed():
    # Layer drop: s1's layer ran in iteration 0 only, in both runs.
    ref, ck = make_pair()
    for record in (ref, ck):
        for phase in (FORWARD, RECOMPUTE):
            record.log.masks.pop((1, "s1", phase), None)
    sites = {0: SITES, 1: ["s0"]}
    assert check(ref, ck, lambda it: sites[it], ITERATIONS, OUTPUTS) == []
    # Judged with iteration 0's sites in every iteration, it reads as never recomputed.
    assert [(m.oracle, m.subject, m.iteration) for m in check(ref, ck, SITES, ITERATIONS, OUTPUTS)] == [
        ("recompute-mask", "s1", 1)]


def test_sites_per_iteration_a_site_drawn_only_in_a_later_iteration_is_checked_there():
    ref, ck = make_pair()
    ck.log.masks[(1, "s1", RECOMPUTE)][0] = ~ck.log.masks[(1, "s1", RECOMPUTE)][0]
    sites = {0: ["s0"], 1: SITES}
    assert [(m.oracle, m.subject, m.iteration) for m in check(ref, ck, lambda it: sites[it], ITERATIONS, OUTPUTS)] \
        == [("recompute-mask", "s1", 1)]


# ------------------------------------------------------------------------------------ buffer


def test_buffer_updated_again_by_a_recompute():
    ref, ck = make_pair()
    ck.buffers[0]["norm.num_batches_tracked"] = torch.tensor(2)
    m = one(run_check(ref, ck), "buffer", "norm.num_batches_tracked", 0)
    assert (m.count, m.total) == (1, 1)


def test_buffer_missing_in_the_checkpointed_run():
    ref, ck = make_pair()
    del ck.buffers[1]["norm.running_mean"]
    m = one(run_check(ref, ck), "buffer", "norm.running_mean", 1)
    assert m.detail == "no such buffer in the checkpointed run"


# ------------------------------------------------------------------------------------ output


def test_output_region_output_differs_in_one_element():
    ref, ck = make_pair()
    ck.log.masks[(0, "r0", FORWARD)][0][3, 1] += 1.0
    m = one(run_check(ref, ck), "output", "r0", 0)
    assert (m.count, m.total, m.first_index) == (1, 16, (3, 1))


def test_output_loss_differs():
    ref, ck = make_pair()
    loss = ck.log.masks[(1, LOSS, FORWARD)][0]
    ck.log.masks[(1, LOSS, FORWARD)] = [torch.nextafter(loss, torch.tensor(2.0))]  # one ulp
    m = one(run_check(ref, ck), "output", LOSS, 1)
    assert (m.count, m.total, m.first_index) == (1, 1, 0)


@pytest.mark.parametrize("missing_in, detail", [("ck", "0 outputs, expected 1"), ("ref", "1 outputs, expected 0")])
def test_output_missing_in_one_run(missing_in, detail):
    ref, ck = make_pair()
    del (ck if missing_in == "ck" else ref).log.masks[(1, "r0", FORWARD)]
    m = one(run_check(ref, ck), "output", "r0", 1)
    assert m.detail == detail


# ---------------------------------------------------------------------------------- identity


def test_identity_replaced_object_with_equal_state():
    ref, ck = make_pair()
    before = ck.objects_before[TRACKER]
    replacement = torch.Generator()
    replacement.set_state(before.get_state())  # equal value, other object
    ck.objects[1] = {TRACKER: replacement}
    m = one(run_check(ref, ck), "identity", TRACKER, 1)
    assert "another generator object" in m.detail


def test_identity_name_no_longer_resolves():
    ref, ck = make_pair()
    ck.objects[0] = {}
    m = one(run_check(ref, ck), "identity", TRACKER, 0)
    assert m.detail == "the name no longer resolves"


# ----------------------------------------------------------------------------------- ambient


def test_ambient_a_leaked_flag_is_reported_where_it_first_differs_once_per_iteration():
    ref, ck = make_pair()
    for it in range(ITERATIONS):  # left changed from the recompute on, as a leak stays
        for point, state in ck.ambient[it][1:]:
            state["sdpa flash enabled"] = False
    found = run_check(ref, ck)
    assert [(m.oracle, m.subject, m.iteration) for m in found] == [
        ("ambient", "in backward, after r0's recompute", 0), ("ambient", "in backward, after r0's recompute", 1)]
    assert found[0].message() == ("ambient in backward, after r0's recompute iteration 0: "
                                  "sdpa flash enabled: got False, expected True")


def test_ambient_two_pieces_at_one_point_are_one_mismatch_naming_both():
    ref, ck = make_pair()
    ck.ambient[1][2][1].update({"default dtype": torch.float64, "autocast cpu enabled": True})
    m = one(run_check(ref, ck), "ambient", "after backward", 1)
    assert m.detail == ("default dtype: got torch.float64, expected torch.float32; "
                        "autocast cpu enabled: got True, expected False")


def test_ambient_a_point_only_one_run_reached_is_left_to_the_other_oracles():
    # (a region input no gradient reached: the gradient oracle reports the missing gradient)
    ref, ck = make_pair()
    del ck.ambient[0][1]
    assert run_check(ref, ck) == []


def test_ambient_during_capture_is_compared_and_named_so():
    ref, ck = make_pair()
    ref.ambient[CAPTURE] = [("after backward", dict(AMBIENT))]
    ck.ambient[CAPTURE] = [("after backward", {**AMBIENT, "sdpa math enabled": False})]
    m = one(run_check(ref, ck), "ambient", "after backward (during capture)", 0)
    assert "sdpa math enabled: got False, expected True" in m.detail


def test_ambient_runs_that_read_nothing_pass():
    ref, ck = make_pair()
    ref.ambient.clear()
    ck.ambient.clear()
    assert run_check(ref, ck) == []
