"""The matrices: which cases a run has (`generate`).

``default``: the first matrix's three programs over every axis value, plus a generated covering
set of programs in which every value of every program factor meets every layout, capture mode and
checkpoint mode at least once (`covering`), the structures (`STRUCTURES`, `structure_covering`),
the drawing SAVE bodies in each placement (`SAVE_PLACEMENTS`, `save_covering`), the pinned cells
of known findings (`PINNED`), the cells that draw from the context-parallel streams
(`CONTEXT_PARALLEL`) and the fuzzer's corpus (`harness.model.corpus`).
``full``: every valid program over every axis value (large).
"""

from __future__ import annotations

import enum
import functools
import itertools
import random
from typing import Iterable, Iterator, Mapping

from ..axes import Capture, Device, Dtype, Interleave, Layout, Mode, Nesting, Op, Passing, Shape
from . import corpus
from .cases import AXES, Case, CaseError, invalid_reason, parse_case_id, parse_value, valid_values
from .programs import (
    CLASSIC,
    FACTORS,
    SHAPES,
    TREES,
    Program,
    ProgramError,
    Tree,
    every_program,
)
from .spec import parse_program

MATRICES = ("default", "full")


def _as_values(axis: str, wanted: object) -> list[enum.Enum]:
    """Normalise a filter: a value, a comma list string, or an iterable of values."""
    if isinstance(wanted, (str, enum.Enum)):
        items: Iterable[object] = str(wanted).split(",") if isinstance(wanted, str) else [wanted]
    else:
        items = wanted  # type: ignore[assignment]
    values = list(dict.fromkeys(parse_value(axis, item) for item in items if str(item).strip()))
    if not values:
        raise CaseError(f"empty filter for {axis}; valid values: {valid_values(axis)}")
    return values


# The case axes every program factor value must meet in the default matrix (`covering`).
COVERED_AXES = ("layout", "capture", "mode")
# The first matrix's programs: native_dropout, f32, small, positional; named by their nesting.
CLASSIC_PROGRAMS = tuple(Program(*CLASSIC, nesting)  # type: ignore[arg-type]
                         for nesting in (Nesting.FLAT, Nesting.NESTED, Nesting.SIBLINGS))


def generate(matrix: str = "default", **filters: object) -> Iterator[Case]:
    """Yield every valid case of `matrix` (``default`` or ``full``), in a stable order, restricted
    by ``axis=value(s)`` filters over `AXES` and ``program=name(s)``.

    A filter value may be an enum member, a value string, a comma-separated string or an iterable
    of these.  Unknown axes, values, programs or matrices raise `CaseError` naming the valid ones.
    """
    if matrix not in MATRICES:
        raise CaseError(f"unknown matrix {matrix!r}; valid: {', '.join(MATRICES)}")
    names = filters.pop("program", None)
    programs = list(dict.fromkeys(parse_programs(names))) if names else None
    choices: dict[str, set[enum.Enum]] = {}  # the axes filtered on (a spec program may lack a factor)
    for axis in AXES:
        wanted = filters.pop(axis, None)
        if wanted is not None:
            choices[axis] = set(_as_values(axis, wanted))
    if filters:
        raise CaseError(f"unknown axis {sorted(filters)[0]!r}; axes are: {', '.join([*AXES, 'program'])}")

    def wanted(case: Case) -> bool:
        return all(getattr(case, axis) in values for axis, values in choices.items())

    devices = [d for d in Device if d in choices.get("device", Device)]
    def source(device: Device) -> Iterator[Case]:
        if programs is not None:  # named programs: every valid cell of each, whatever the matrix
            return _cases(device, programs)
        return _full(device) if matrix == "full" else _default(device)

    # filters are checked above, before the first case is asked for
    return (case for device in devices for case in source(device) if wanted(case))


def parse_programs(wanted: object) -> list[Tree]:
    """Programs from names (a comma list string or an iterable); a bad name raises `CaseError`."""
    names = str(wanted).split(",") if isinstance(wanted, str) else list(wanted)  # type: ignore[call-overload]
    try:
        return [name if isinstance(name, Program) else parse_program(str(name)) for name in names if str(name).strip()]
    except ProgramError as exc:
        raise CaseError(str(exc)) from None


def _cases(device: Device, programs: Iterable[Tree]) -> Iterator[Case]:
    """Every valid case of these programs on `device`, program by program."""
    for program in programs:
        for mode, layout, capture, interleave in itertools.product(Mode, Layout, Capture, Interleave):
            case = Case(mode, layout, capture, program, interleave, device)
            if invalid_reason(case) is None:
                yield case


def _full(device: Device) -> Iterator[Case]:
    return _cases(device, every_program())


# Cases the default matrix always has, beyond the covering set: the cells of known findings, so a
# fix (or a regression) shows whatever the covering design happens to pick.  Ids without device.
PINNED = (
    # torch.utils.checkpoint (non-reentrant) saves the RNG of the devices of its positional tensor
    # arguments: an input by keyword or through a closure leaves the CUDA generator unsaved.
    "nonreentrant-default-eager-native_dropout.f32.small.keyword.flat-none",
    "nonreentrant-default-eager-native_dropout.f32.small.closure.flat-none",
    "nonreentrant-untracked-eager-native_dropout.f32.small.keyword.flat-none",
    # a region entered under sdpa_kernel: does the recompute run the same attention backend?
    "nonreentrant-default-eager-sdpa_math.f32.small.sdpa_kernel.flat-none",
    "reentrant-default-eager-sdpa_math.f32.small.sdpa_kernel.flat-none",
    # three regions with recomputes pending at once (a checkpoint with two snapshot slots fails here)
    "reentrant-default-eager-wide-none",
    "nonreentrant-default-eager-wide-none",
    # a region that draws nothing (dropout p = 0) with draws between forward and backward: a
    # checkpoint must not move a stream for it (rewinding and not restoring loses those draws)
    "nonreentrant-default-eager-(dropout_p0)-draws",
    "reentrant-untracked-eager-(dropout_p0)-draws",
    # attention with dropout followed by another RNG site in one region (issue 24): a selective
    # policy that saves the attention op (torchtitan's) skips its RNG advance in the recompute, and
    # the dropout after it redraws from a shifted position (math attention decomposes on the CPU:
    # there a policy that saves the first RNG op shows the same skew)
    "nonreentrant-default-eager-(sdpa_math+dropout)-none",
    "nonreentrant-tracked-eager-(sdpa_math+dropout)-draws",
    "reentrant-default-eager-(sdpa_math+dropout)-none",
    # out-of-place then in-place RNG in one region: the first saved, the second redrawn
    "nonreentrant-default-eager-(rand_like+bernoulli_)-none",
    # one region per RNG op the compiled memory-budget partitioner must not redraw: the three on
    # the proposed fix's random-op list and four beside it (findings/compiled-budget-rng.md)
    *(f"nonreentrant-default-eager-({op})-none" for op in (
        "native_dropout", "rand_like", "randn_like", "bernoulli_", "multinomial", "poisson", "exponential_")),
)


# Sites on Megatron's context-parallel (``@c``) and model-and-context-parallel (``@m``) streams, in
# both modes and both layouts that hold them (issue 57): one process draws them like any tracker
# stream; under ``--ranks N --cp K`` (K > 1) their seeds follow the context-parallel rank
# (`rank_context`), so a checkpoint that groups ranks without regard to context parallelism gets
# other gradients on the ranks of CP rank 1 here, and nowhere else in the default matrix.
CONTEXT_PARALLEL = (
    "nonreentrant-tracked-eager-(native_dropout@c+native_dropout@m+native_dropout)-none",
    "reentrant-tracked-eager-(native_dropout@c+native_dropout@m+native_dropout)-draws",
    "nonreentrant-mixed-eager-(native_dropout@c+native_dropout)+(native_dropout+rand@m)-draws",
    "reentrant-mixed-eager-(native_dropout@c+native_dropout)+(native_dropout+rand@m)-none",
)


# Pinned on CUDA only (capture): TransformerEngine's fix for handle aliasing (the seed PR) is tested
# upstream with a checkpointed function that has no TE layers, given a tracker, under CUDA-graph
# capture with dropout p = 0 as well as p > 0.  A region whose only site has p = 0 draws nothing:
# the checkpoint must run it under capture and leave every stream where it was.
PINNED_CUDA = (
    "nonreentrant-tracked-eager-(dropout_p0)-none",
    "nonreentrant-tracked-separate-(dropout_p0)-none",
    "nonreentrant-tracked-single-(dropout_p0)-none",
    "reentrant-tracked-separate-(dropout_p0)-none",
    "reentrant-tracked-single-(dropout_p0)-none",
    "nonreentrant-tracked-single-(native_dropout)-none",  # beside them: the same with p > 0
    "reentrant-tracked-single-(native_dropout)-none",
    # torchtitan's SAC save list: the fused attention ops saved, the dropout after them recomputed
    # (measured on an H200, torch 2.11: every input-gradient element wrong in f32)
    "nonreentrant-default-eager-(sdpa_efficient+dropout)-none",
    "nonreentrant-default-eager-bf16:(sdpa_efficient+dropout)-none",
    "nonreentrant-default-eager-bf16:(sdpa_flash+dropout)-none",
    "nonreentrant-default-eager-bf16:(sdpa_cudnn+dropout)-none",
    "nonreentrant-untracked-eager-(sdpa_efficient+native_dropout)-draws",
    # cuDNN attention in one graph, reentrant, no tracker: TransformerEngine 2.20.2 crashes the CUDA
    # context here (an illegal memory access), torch's checkpoint passes, bundled declares a limit
    "reentrant-untracked-single-sdpa_cudnn.f16.small.sdpa_kernel.flat-none",
)


# Structures the named programs cannot have (issue 29), each a spec program that must meet every
# layout, capture mode and checkpoint mode in the default matrix (`structure_covering`): a checkpoint
# bug that needs one of them is a default-matrix cell, not only a fuzz finding.
STRUCTURES = (
    # a third and a fourth iteration: per-step snapshot buffers that go stale after two steps
    "x3:(native_dropout+(native_dropout))",
    "x4:(native_dropout)+(dropout)",
    # out-of-place and in-place RNG ops mixed in one region, both orders: a checkpoint (or a
    # selective policy) that replays saved out-of-place outputs and redraws in-place ones draws
    # the in-place ones from a shifted position
    "(native_dropout+dropout_inplace)",
    "(bernoulli_+rand)",
    # attention beside another RNG site in one region, and attention that pins no backend after
    # a region (its output shows SDPA flags a checkpoint left changed)
    "(sdpa_math+native_dropout)",
    "(native_dropout+native_dropout)+sdpa_auto",
    # one tensor feeding two regions (parallel branches), two sites of a region, or one region twice
    "(native_dropout)&(native_dropout)",
    "(native_dropout&native_dropout)",
    "twice(native_dropout+native_dropout)",
    # an inner region as its outer region's first item: a non-reentrant checkpoint hands it the
    # outer's own input tensor, so anything keyed by the input tensor collides
    "((native_dropout)+native_dropout)",
    # SAVE regions (issue 38): a drawing body followed by more draws (a checkpoint that keeps the
    # body and does not rerun it must put the stream back after it, or every later draw shifts),
    # and a body that draws nothing
    "(native_dropout+save(rand)+native_dropout)",
    "(save(nodraw)+native_dropout)",
)
# Drawing SAVE bodies in each place a checkpoint that keeps them meets them (issue 57): a body
# that keeps its draws (torch_remat's ``region(..., recompute=False)``) must be followed, in the
# recompute, by the streams put back where the forward left them after it, or every later draw of
# its stream shifts.  Each program has a later site of the body's stream in every layout (mixed and
# shared alternate streams by site index: the site two after the body's).  `save_covering` runs
# each in every layout and capture mode in non-reentrant mode alone (torch_remat has no reentrant
# form) and once reentrant.
SAVE_PLACEMENTS = {
    # the region's first draw: torch_remat's usual layout, a SAVE region around attention
    "first": "(save(sdpa_math)+native_dropout+native_dropout)",
    # after a draw, ending the region's draws
    "after": "(native_dropout+save(rand))",
    # between draws, a body of two sites (one per stream of the mixed and shared layouts)
    "between": "(native_dropout+save(rand+native_dropout)+native_dropout)",
    # inside an inner region (torch_remat declares nested regions unsupported; for the others
    # the mark is an annotation, and the program a nested one)
    "inner": "(native_dropout+(save(rand)+native_dropout+native_dropout))",
}


@functools.lru_cache(maxsize=None)
def save_covering(device: Device) -> tuple[Case, ...]:
    """Cases of every `SAVE_PLACEMENTS` program: in non-reentrant mode one per layout, the capture
    modes the device has taken in turn (so the non-reentrant cases alone meet every layout and
    capture mode), and one reentrant case; the interleave alternates."""
    captures = [c for c in Capture if device is Device.CUDA or c is Capture.EAGER]
    layouts = list(Layout)
    rows: list[Case] = []
    for n, spec in enumerate(SAVE_PLACEMENTS.values()):
        program = parse_program(spec)
        cells = [(Mode.NONREENTRANT, layout, captures[(n + k) % len(captures)])
                 for k, layout in enumerate(layouts)]
        cells.append((Mode.REENTRANT, layouts[(n + 1) % len(layouts)], captures[n % len(captures)]))
        for mode, layout, capture in cells:
            case = Case(mode, layout, capture, program, Interleave.DRAWS if len(rows) % 2 else Interleave.NONE,
                        device)
            reason = invalid_reason(case)
            if reason:
                raise AssertionError(f"SAVE placement {spec} in {case.id} is invalid: {reason}")
            rows.append(case)
    return tuple(rows)


# Values only `STRUCTURES` bring in: the covering of the named programs leaves them out, so that
# adding a structure never reshuffles the cells the expectations file names by id.
STRUCTURE_ONLY = (Op.SDPA_AUTO, Passing.TWICE)


@functools.lru_cache(maxsize=None)
def structure_covering(device: Device) -> tuple[Case, ...]:
    """Cases of every `STRUCTURES` program such that each meets every layout, every capture mode
    the device has and both checkpoint modes (greedy, in a fixed order: the same cases on every
    run), alternating the interleave."""
    captures = [c for c in Capture if device is Device.CUDA or c is Capture.EAGER]
    rows: list[Case] = []
    for spec in STRUCTURES:
        program = parse_program(spec)
        todo = {("layout", v) for v in Layout} | {("capture", v) for v in captures} | {("mode", v) for v in Mode}
        while todo:
            best, gain = None, 0
            modes = list(Mode) if len(rows) % 2 else list(Mode)[::-1]  # ties alternate the mode
            for layout, capture, mode in itertools.product(Layout, captures, modes):
                case = Case(mode, layout, capture, program,
                            Interleave.DRAWS if len(rows) % 2 else Interleave.NONE, device)
                covers = len(todo & {("layout", layout), ("capture", capture), ("mode", mode)})
                if covers > gain and invalid_reason(case) is None:
                    best, gain = case, covers
            if best is None:
                raise AssertionError(f"no valid case of {spec} covers {sorted(str(v) for _, v in todo)}")
            rows.append(best)
            todo -= {("layout", best.layout), ("capture", best.capture), ("mode", best.mode)}
    return tuple(rows)


def _default(device: Device) -> Iterator[Case]:
    seen: set[str] = set()
    classic = _cases(device, CLASSIC_PROGRAMS)
    pins = PINNED + CONTEXT_PARALLEL + (PINNED_CUDA if device is Device.CUDA else ())
    pinned = (parse_case_id(f"{case_id}-{device.value}") for case_id in pins)
    for case in itertools.chain(classic, covering(device), structure_covering(device), save_covering(device),
                                pinned, corpus.cases(device.value)):
        if case.id not in seen:
            seen.add(case.id)
            yield case


Pair = tuple[str, enum.Enum, str, enum.Enum]  # (factor, value, axis, value)
# What the rules read: the program factors but nesting, and two case axes (layout, nesting and
# interleave are free in every valid combination of these).
_CORE_FACTORS = ("op", "dtype", "shape", "passing")
_CORE_AXES = ("mode", "capture")
_CORE = (*_CORE_FACTORS, *_CORE_AXES)


def case_pairs(case: Case) -> set[Pair]:
    """The (program factor value, case axis value) pairs a case covers."""
    return _pairs({name: getattr(case, name) for name in (*FACTORS, *COVERED_AXES)})


def _pairs(row: Mapping[str, enum.Enum]) -> set[Pair]:
    return {(factor, row[factor], axis, row[axis]) for factor in FACTORS for axis in COVERED_AXES}


@functools.lru_cache(maxsize=None)
def _cores(device: Device) -> tuple[dict[str, enum.Enum], ...]:
    """The valid (op, dtype, shape, passing, mode, capture) combinations on `device`: the rules
    read only these (and the device), so layout, nesting and interleave are free in any of them."""
    out = []
    for values in itertools.product(Op, Dtype, Shape, Passing, Mode, Capture):
        if any(value in STRUCTURE_ONLY for value in values):
            continue
        core = dict(zip(_CORE, values))
        case = Case(core["mode"], Layout.DEFAULT, core["capture"],  # type: ignore[arg-type]
                    Program(*values[:4], Nesting.FLAT), Interleave.NONE, device)  # type: ignore[arg-type]
        if invalid_reason(case) is None:
            out.append(core)
    return tuple(out)


def required_pairs(device: Device) -> set[Pair]:
    """Every (program factor value, layout / capture / mode value) pair some valid case on
    `device` has: what the default matrix must cover (layout and nesting are free in every
    valid combination, so they pair with everything that is valid at all)."""
    pairs: set[Pair] = set()
    for core in _cores(device):
        for factor in _CORE_FACTORS:
            pairs |= {(factor, core[factor], axis, core[axis]) for axis in _CORE_AXES}
            pairs |= {(factor, core[factor], "layout", layout) for layout in Layout}
        pairs |= {("nesting", n, axis, core[axis]) for n in Nesting for axis in _CORE_AXES}
    pairs |= {("nesting", n, "layout", layout) for n in Nesting for layout in Layout}
    return pairs


def _count_sites(items: list) -> int:
    return sum(_count_sites(item) if isinstance(item, list) else 1 for item in items)


_SITES = {nesting: _count_sites(tree) for nesting, tree in TREES.items()}


def _cost(row: Mapping[str, enum.Enum]) -> int:
    """A case's rough run time, to break ties in `covering`: elements per activation times the
    sites of its tree (a 1024x1024 program of the deep tree costs 2^20 x 6), four times that
    under autocast (its 1024x1024 bfloat16 matmuls are slow on a CPU)."""
    rows, cols = SHAPES[row["shape"]]  # type: ignore[index]
    return rows * cols * _SITES[row["nesting"]] * (4 if row["passing"] is Passing.AUTOCAST else 1)  # type: ignore[index]


@functools.lru_cache(maxsize=None)
def covering(device: Device) -> tuple[Case, ...]:
    """Generated cases for the default matrix: together with the first matrix's cases, every pair
    of `required_pairs` appears in at least one case.  Greedy and seeded (the same cases on every
    run): each new case is, among valid completions of the first pair still uncovered, the one
    that covers the most uncovered pairs."""
    covered: set[Pair] = set()
    for case in _cases(device, CLASSIC_PROGRAMS):
        covered |= case_pairs(case)
    todo = required_pairs(device) - covered
    rng = random.Random(20261203)
    cores = _cores(device)
    rows: list[Case] = []
    while todo:
        target = min(todo, key=lambda p: (p[0], p[1].value, p[2], p[3].value))
        factor, value, axis, axis_value = target
        best: tuple[int, dict[str, enum.Enum], int] | None = None
        matching = [c for c in cores if c.get(factor, value) is value and c.get(axis, axis_value) is axis_value]
        for core in rng.sample(matching, min(len(matching), 32)):
            # The gain of a row splits into pairs of the core alone, of the layout, of the nesting
            # and the one nesting x layout pair: add them up instead of building every row's set.
            fixed = sum((f, core[f], a, core[a]) in todo for f in _CORE_FACTORS for a in _CORE_AXES)
            by_layout = {lay: sum((f, core[f], "layout", lay) in todo for f in _CORE_FACTORS) for lay in Layout}
            by_nesting = {n: sum(("nesting", n, a, core[a]) in todo for a in _CORE_AXES) for n in Nesting}
            for layout, nesting in itertools.product(Layout, Nesting):
                row = {**core, "layout": layout, "nesting": nesting}
                if row.get(factor) is not value or row.get(axis) is not axis_value:
                    continue
                gain = (fixed + by_layout[layout] + by_nesting[nesting]
                        + (("nesting", nesting, "layout", layout) in todo))
                cost = _cost(row)
                if best is None or (gain, -cost) > (best[0], -best[2]):
                    best = (gain, row, cost)
        if best is None:
            raise AssertionError(f"no valid case covers {factor}={value} x {axis}={axis_value}")
        row = best[1]
        rows.append(Case(row["mode"], row["layout"], row["capture"],  # type: ignore[arg-type]
                         Program(*(row[f] for f in FACTORS)),  # type: ignore[arg-type]
                         Interleave.DRAWS if len(rows) % 2 else Interleave.NONE, device))
        todo -= _pairs(row)
    return tuple(rows)


