"""Region programs: names, trees, the ops registry, the covering default matrix and the full
matrix, and that the negative controls are caught whatever the program runs."""

from __future__ import annotations

import pytest
import torch

from harness import impls
from harness.model import ops
from harness.model.cases import Capture, CaseError, Device, Layout, Mode, parse_case_id
from harness.model.matrix import STRUCTURE_ONLY, case_pairs, covering, generate, required_pairs
from harness.model.programs import (
    FACTORS,
    SDPA_OPS,
    Nesting,
    Op,
    Passing,
    Program,
    ProgramError,
    Region,
    Site,
    every_program,
)
from harness.model.spec import parse_program
from harness.run import runner
from harness.run.runner import Outcome

# --- names and trees ------------------------------------------------------------------------------


def test_every_program_name_round_trips():
    bad = [p.name for p in every_program() if parse_program(p.name) != p]
    assert bad == []


def test_first_matrix_programs_keep_their_one_word_names():
    assert [parse_program(n).name for n in ("flat", "nested", "siblings")] == ["flat", "nested", "siblings"]
    assert parse_program("flat").op is Op.NATIVE_DROPOUT
    assert parse_program("native_dropout.f32.small.positional.flat") == parse_program("flat")


@pytest.mark.parametrize("bad", ["bogus", "rand.f32", "rand.f64.small.positional.flat", "a.b.c.d.e.f"])
def test_a_bad_program_name_is_one_line_naming_what_is_valid(bad):
    with pytest.raises(ProgramError) as excinfo:
        parse_program(bad)
    assert "\n" not in str(excinfo.value)


def test_a_bad_program_in_a_case_id_or_filter_is_a_case_error():
    with pytest.raises(CaseError, match="unknown op 'bogus'"):
        parse_case_id("reentrant-default-eager-bogus.f32.small.positional.flat-none-cpu")
    with pytest.raises(CaseError, match=r"unknown program .triple.: a program is a nesting \(flat, nested"):
        list(generate(program="triple"))


def _tree(program: Program) -> list:
    def walk(region):
        return [region.name, [walk(i) if hasattr(i, "items") else i.name for i in region.items]]
    return [walk(r) for r in program.regions()]


def test_trees_number_sites_and_regions_in_execution_order():
    assert _tree(parse_program("flat")) == [["r0", ["s0", "s1"]]]
    assert _tree(parse_program("nested")) == [["r0", ["s0", ["r1", ["s1", "s2"]], "s3"]]]
    assert _tree(parse_program("siblings")) == [["r0", ["s0", "s1"]], ["r1", ["s2", "s3"]]]
    assert _tree(parse_program("deep")) == [["r0", ["s0", ["r1", ["s1", ["r2", ["s2", "s3"]], "s4"]], "s5"]]]
    assert _tree(parse_program("wide")) == [["r0", ["s0", "s1"]], ["r1", ["s2", "s3"]], ["r2", ["s4", "s5"]]]


def test_deep_nests_three_levels_and_wide_has_three_regions_pending_at_once():
    deep, wide = parse_program("deep"), parse_program("wide")
    assert len(deep.all_regions()) == 3 and len(deep.regions()) == 1
    assert len(wide.regions()) == 3  # all three forwards run before the one backward


def test_nodraw_programs_alternate_a_silent_site_with_a_dropout():
    program = parse_program("nodraw.f32.small.positional.flat")
    assert [s.op for s in program.sites()] == [Op.NODRAW, Op.NATIVE_DROPOUT]


# --- the ops registry -----------------------------------------------------------------------------


def test_the_registry_has_one_entry_per_op_and_says_what_it_records():
    assert set(ops.REGISTRY) == set(Op)
    assert all(spec.records for spec in ops.REGISTRY.values())
    assert [op for op, spec in ops.REGISTRY.items() if not spec.draws] == [Op.NODRAW, Op.DROPOUT_P0, Op.SDPA_AUTO]


@pytest.mark.parametrize("op", [op for op in Op if not ops.REGISTRY[op].cuda_only], ids=lambda op: op.value)
def test_every_cpu_op_draws_from_the_forked_stream_and_returns_its_shape(op):
    tracker = impls.load("bundled").make_tracker("cpu")
    tracker.add("s", 7)
    h = torch.rand(63, 65)
    before = (torch.get_rng_state(), tracker.get_states()["s"].clone())
    with tracker.fork("s"):
        out, drawn = ops.REGISTRY[op].apply(h, True)
    after = (torch.get_rng_state(), tracker.get_states()["s"])
    assert out.shape == h.shape
    assert torch.equal(before[0], after[0])  # the default generator did not move
    assert torch.equal(before[1], after[1]) is (not ops.REGISTRY[op].draws)
    assert drawn.numel() > 0


def test_attention_backends_that_need_a_gpu_are_never_generated_for_the_cpu():
    cpu_ops = {case.op for case in generate("full", device="cpu")}
    assert cpu_ops == {op for op in Op if not ops.REGISTRY[op].cuda_only}
    assert ops.invalid_reason(Op.SDPA_FLASH, parse_program("flat").dtype, parse_program("flat").shape, "cuda")


def test_rules_prune_what_cannot_be_run_anywhere():
    full = list(generate("full"))
    assert not [c for c in full if c.passing is Passing.CLOSURE and c.mode is Mode.REENTRANT]
    assert not [c for c in full if c.passing is Passing.SDPA_KERNEL and c.op.value[:4] != "sdpa"]
    assert not [c for c in full if c.op in (Op.SDPA_FLASH, Op.SDPA_CUDNN) and c.dtype.value == "f32"]


# --- the matrices ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", list(Device), ids=lambda d: d.value)
def test_the_default_matrix_covers_every_factor_value_with_every_layout_capture_and_mode(device):
    # What must be covered, found by brute force over the full matrix (not by required_pairs'
    # shortcut, which this also checks).
    # Values only the structures bring in (STRUCTURE_ONLY) are left to their own covering (below).
    possible: set = set()
    for case in generate("full", device=device):
        possible |= {pair for pair in case_pairs(case) if pair[1] not in STRUCTURE_ONLY}
    assert required_pairs(device) == possible
    covered: set = set()
    for case in generate(device=device):
        covered |= case_pairs(case)
    assert possible - covered == set()


IN_PLACE = {Op.DROPOUT_INPLACE, Op.BERNOULLI, Op.NORMAL, Op.UNIFORM, Op.EXPONENTIAL}


def _items(items):
    for item in items:
        yield item
        if hasattr(item, "items") and not callable(item.items):
            yield from _items(item.items)


def structure_kinds(program) -> set[str]:
    """The structures (issue 29) a program has, read from its tree, not from its spelling."""
    kinds = set()
    if program.iterations >= 3:
        kinds.add("three or more iterations")
    for region in program.all_regions():
        drawn = {site.op for site in region.sites() if ops.REGISTRY[site.op].draws}
        if drawn & IN_PLACE and drawn - IN_PLACE - set(SDPA_OPS):
            kinds.add("in-place and out-of-place RNG ops in one region")
        if drawn & set(SDPA_OPS) and drawn - set(SDPA_OPS):
            kinds.add("attention beside another RNG op in one region")
    if any(site.op is Op.SDPA_AUTO for site in program.sites()):
        kinds.add("attention that pins no backend")
    if any(item.parallel for item in _items(program.items())):
        kinds.add("one tensor feeding two items")
    if Passing.TWICE in program.passings():
        kinds.add("one tensor passed twice to a region")
    if any(region.items and isinstance(region.items[0], Region) for region in program.all_regions()):
        kinds.add("a region as its outer region's first item")
    return kinds


@pytest.mark.parametrize("device", list(Device), ids=lambda d: d.value)
def test_every_structure_meets_every_layout_capture_and_mode_in_the_default_matrix(device):
    # Bugs that need a third iteration, mixed ops, shared inputs or unpinned attention must be
    # default-matrix cells (issue 29), in every layout, capture mode and checkpoint mode.
    captures = [c for c in Capture if device is Device.CUDA or c is Capture.EAGER]
    wanted = {(axis, value) for axis, values in (("layout", Layout), ("capture", captures), ("mode", Mode))
              for value in values}
    met: dict[str, set] = {}
    for case in generate(device=device):
        for kind in structure_kinds(case.program):
            met.setdefault(kind, set()).update({("layout", case.layout), ("capture", case.capture),
                                                ("mode", case.mode)})
    assert len(met) == 7, sorted(met)
    assert {kind: wanted - seen for kind, seen in met.items() if wanted - seen} == {}


def _draws_from(case, sites) -> set[str]:
    """The generators `sites` of `case` draw from (the shared pair's b is an alias of a)."""
    streams = case.streams()
    return {"a" if streams[site.name] == "b" else streams[site.name] for site in sites if ops.REGISTRY[site.op].draws}


def save_placements(case) -> set[str]:
    """Where a SAVE body that draws sits in `case`'s program (issue 57), read from its tree: as
    its region's first draw with draws after it (``first``), after a draw as the region's last
    (``after``), between draws (``between``), in a region inside another (``inner``); and
    ``followed`` where a later draw of its region is of a stream the body drew from (the draw a
    checkpoint that keeps the body shifts when it does not put that stream back after it)."""
    found = set()
    inner = {id(item) for region in case.program.all_regions() for item in region.items if isinstance(item, Region)}
    for region in case.program.all_regions():
        order = region.sites()
        for number in {item.save for item in region.items if isinstance(item, Site) and item.save is not None}:
            body = [n for n, site in enumerate(order) if site.save == number]
            if not _draws_from(case, [order[n] for n in body]):
                continue
            before = _draws_from(case, order[:body[0]])
            after = _draws_from(case, order[body[-1] + 1:])
            found.add("between" if before and after else "after" if before else "first" if after else "alone")
            if id(region) in inner:
                found.add("inner")
            if after & _draws_from(case, [order[n] for n in body]):
                found.add("followed")
    return found - {"alone"}


@pytest.mark.parametrize("device", list(Device), ids=lambda d: d.value)
def test_every_save_placement_meets_every_layout_capture_and_mode_and_nonreentrant_alone_too(device):
    # A checkpoint that keeps SAVE bodies (torch_remat, non-reentrant only) must meet a drawing
    # body at a region's start, after a draw, between draws and in an inner region, followed by a
    # draw of its stream, in every layout and capture mode, in its own mode alone (issue 57).
    captures = [c for c in Capture if device is Device.CUDA or c is Capture.EAGER]
    wanted = {(axis, value) for axis, values in (("layout", Layout), ("capture", captures)) for value in values}
    met: dict[str, set] = {}
    alone: dict[str, set] = {}
    for case in generate(device=device):
        for placement in save_placements(case):
            cell = {("layout", case.layout), ("capture", case.capture), ("mode", case.mode)}
            met.setdefault(placement, set()).update(cell)
            if case.mode is Mode.NONREENTRANT:
                alone.setdefault(placement, set()).update(cell)
    assert sorted(met) == ["after", "between", "first", "followed", "inner"]
    every_mode = wanted | {("mode", mode) for mode in Mode}
    assert {placement: every_mode - seen for placement, seen in met.items() if every_mode - seen} == {}
    assert {placement: wanted - seen for placement, seen in alone.items() if wanted - seen} == {}


def test_save_placements_are_read_from_the_tree():
    def placed(case_id):
        return save_placements(parse_case_id(case_id))
    assert placed("nonreentrant-default-eager-(save(sdpa_math)+native_dropout)-none-cpu") == {"first", "followed"}
    assert placed("nonreentrant-mixed-eager-(save(rand)+native_dropout)-none-cpu") == {"first"}  # s1 draws t
    assert placed("nonreentrant-default-eager-(native_dropout+save(rand))-none-cpu") == {"after"}
    assert placed("nonreentrant-shared-eager-(native_dropout+save(rand)+native_dropout)-none-cpu") == \
        {"between", "followed"}
    assert placed("nonreentrant-default-eager-(native_dropout+(save(rand)+native_dropout))-none-cpu") == \
        {"first", "inner", "followed"}
    assert placed("nonreentrant-default-eager-(save(nodraw)+native_dropout)-none-cpu") == set()
    assert placed("nonreentrant-default-eager-(save(rand))+(native_dropout)-none-cpu") == set()


def _save_cells(impl) -> list:
    """The default CPU matrix's cases with a drawing SAVE body that `impl` runs."""
    return [case for case in generate(device="cpu") if impl.supports(case) is None
            and any(site.save is not None and ops.REGISTRY[site.op].draws for site in case.program.sites())]


def test_a_hook_that_does_not_put_the_streams_back_after_a_save_body_fails_in_the_default_matrix():
    # The controls of issue 57: torch_remat with a hook that restores every stream at region
    # entry, and after a SAVE body nothing (entry-only) or only the default generators
    # (save-no-tracker).  Each fails exactly where a later draw of its region is of a stream the
    # body drew from and the hook left behind; the second passes every cell the default matrix had
    # before the SAVE placements (`matrix.save_covering`): only they can catch it.
    pytest.importorskip("torch_remat")
    from harness.model.matrix import save_covering
    from harness.verdict import expectations

    entries = expectations.load()
    new = {case.id for case in save_covering(Device.CPU)}
    for name, left_behind in (("neg-remat-entry-only", {"d", "t", "c", "m", "a"}),
                              ("neg-remat-save-no-tracker", {"t", "c", "m", "a"})):
        impl = impls.load(name)
        seen, wrong = {}, []
        for case in _save_cells(impl):
            result = runner.run(case, impl)
            seen[case.id] = result.outcome
            want = Outcome.MISMATCH if _followed_on(case, left_behind) else Outcome.PASS
            fired = {m.oracle for m in result.mismatches}
            if result.outcome is not want or (want is Outcome.MISMATCH and not {"recompute-mask", "gradient"} <= fired):
                wrong.append(f"{case.id}: {result.outcome.value} {sorted(fired)}, expected {want.value}")
            claimed = expectations.find(entries, name, case)
            if (claimed is not None) != (want is Outcome.MISMATCH):  # its model claims exactly these
                wrong.append(f"{case.id}: claimed by {claimed and claimed.label}")
        assert wrong == [], name
        failed = {cid for cid, outcome in seen.items() if outcome is Outcome.MISMATCH}
        assert failed & new, name
        if name == "neg-remat-save-no-tracker":
            assert failed <= new, failed - new  # the matrix before issue 57 could not catch it
            assert {parse_case_id(cid).layout for cid in failed} == {Layout.TRACKED, Layout.MIXED, Layout.SHARED}


def _followed_on(case, streams: set[str]) -> bool:
    """Whether in some region a SAVE body draws from one of `streams` (codes, b as a) and a later
    draw of its region is of that stream."""
    for region in case.program.all_regions():
        order = region.sites()
        for n, site in enumerate(order):
            if site.save is None or not ops.REGISTRY[site.op].draws:
                continue
            drawn = _draws_from(case, [site]) & streams
            later = [s for s in order[n + 1:] if s.save != site.save]
            if drawn & _draws_from(case, later):
                return True
    return False


def test_the_covering_set_is_the_same_on_every_run():
    assert [c.id for c in covering(Device.CUDA)] == [c.id for c in covering.__wrapped__(Device.CUDA)]


def test_the_default_matrix_is_small_and_the_full_one_is_the_product():
    assert len(covering(Device.CPU)) <= 100 and len(covering(Device.CUDA)) <= 120
    full_cpu = sum(1 for _ in generate("full", device="cpu"))
    eager_programs = sum(1 for p in every_program() if not ops.REGISTRY[p.op].cuda_only)
    assert full_cpu > 100 * len(list(generate(device="cpu")))
    assert full_cpu < eager_programs * len(Mode) * len(Layout) * 2  # x interleave, minus pruned


def test_program_filter_and_factor_filters_select_from_the_chosen_matrix():
    deep = list(generate("full", device="cpu", op="rand", dtype="bf16", shape="odd", passing="keyword",
                         nesting="deep"))
    assert {c.program.name for c in deep} == {"rand.bf16.odd.keyword.deep"}
    assert len(deep) == len(Mode) * len(Layout) * 2
    assert list(generate("full", program="rand.bf16.odd.keyword.deep", device="cpu")) == deep
    with pytest.raises(CaseError, match="unknown matrix"):
        list(generate("huge"))


# --- the controls are caught whatever the program -----------------------------------------------


def _one_case_per_value(layout: Layout) -> list:
    """One eager CPU case per op, dtype, shape, passing and nesting value (nonreentrant, so every
    passing is valid), in `layout`."""
    out, base = [], dict(op="native_dropout", dtype="f32", shape="small", passing="positional", nesting="flat")
    for factor, enum_type in FACTORS.items():
        for value in enum_type:
            factors = {**base, factor: value.value}
            name = ".".join(factors[f] for f in FACTORS)
            case_id = f"nonreentrant-{layout.value}-eager-{name}-none-cpu"
            try:
                out.append(parse_case_id(case_id))
            except CaseError:
                continue  # an op this device does not have, or sdpa_kernel without attention
    return out


@pytest.mark.parametrize("control,oracle", [
    ("neg-live-handles", "recompute-mask"), ("neg-no-recompute", "recompute-mask"),
    ("neg-wrong-output", "output"), ("neg-ignore-tracker", "recompute-mask"),
])
def test_controls_over_programs(control, oracle):
    impl = impls.load(control)
    missed = []
    for case in _one_case_per_value(Layout.TRACKED):
        result = runner.run(case, impl)
        if result.outcome is not Outcome.MISMATCH or oracle not in {m.oracle for m in result.mismatches}:
            missed.append(f"{case.id}: {result.outcome.value} {result.summary()[:120]}")
    assert missed == []


def test_bundled_passes_one_case_of_every_value_in_both_modes():
    impl = impls.load("bundled")
    failed = []
    for case in _one_case_per_value(Layout.MIXED):
        for mode in Mode:
            if mode is Mode.REENTRANT and case.passing is Passing.CLOSURE:
                continue
            result = runner.run(parse_case_id(case.id.replace("nonreentrant-", f"{mode.value}-", 1)), impl)
            if result.outcome is not Outcome.PASS:
                failed.append(f"{mode.value} {case.id}: {result.outcome.value} {result.summary()[:160]}")
    assert failed == []


def test_two_snapshot_slots_are_caught_exactly_where_three_regions_are_pending():
    impl = impls.load("neg-two-slots")
    seen = {}
    for mode in Mode:
        for nesting in Nesting:
            case = parse_case_id(f"{mode.value}-default-eager-{nesting.value}-none-cpu")
            result = runner.run(case, impl)
            seen[(mode.value, nesting.value)] = (result.outcome.value, {m.oracle for m in result.mismatches})
    for (mode, nesting), (outcome, fired) in seen.items():
        if nesting in ("deep", "wide"):
            assert outcome == "mismatch" and {"recompute-mask", "gradient"} <= fired, (mode, nesting)
        else:
            assert outcome == "pass", (mode, nesting, fired)


def test_reentrant_regions_that_regroup_a_fan_in_are_invalid_and_why():
    # A reentrant checkpoint hands its input one summed gradient: beside other readers of that
    # input, three or more terms are added in another grouping.  Forced to run anyway, every
    # reentrant checkpoint (bundled's and torch's) differs there in gradient bits only, masks
    # and streams equal: float rounding, which no bit-exact oracle can judge.
    from harness.model.cases import Capture, Case, Interleave, invalid_reason
    from harness.model.spec import parse_spec

    program = parse_spec("(native_dropout&native_dropout)&native_dropout")
    forced = Case(Mode.REENTRANT, Layout.DEFAULT, Capture.EAGER, program, Interleave.NONE, Device.CPU)
    assert "float addition in another grouping" in invalid_reason(forced)
    for impl in ("bundled", "torch"):
        result = runner.run(forced, impls.load(impl))
        assert {m.oracle for m in result.mismatches} == {"gradient"}, result.summary()
    nonreentrant = Case(Mode.NONREENTRANT, Layout.DEFAULT, Capture.EAGER, program, Interleave.NONE, Device.CPU)
    assert invalid_reason(nonreentrant) is None
    assert runner.run(nonreentrant, impls.load("bundled")).outcome is Outcome.PASS
    # two readers add the same either way; a twice region hands back one gradient per argument
    for spec in ("(native_dropout&native_dropout)", "(native_dropout)&(native_dropout)&(native_dropout)",
                 "twice(native_dropout)&native_dropout"):
        assert invalid_reason(Case(Mode.REENTRANT, Layout.DEFAULT, Capture.EAGER, parse_spec(spec),
                                   Interleave.NONE, Device.CPU)) is None, spec
