"""What a case does, as facts an expectation entry can name (cases/expectations.toml).

An entry says which cases a known bug shows in by what they do, not by how their ids are spelled,
so that one entry covers a named program and every spec program with the same property.  Each key
below is a fact; an entry's facts must all hold (a list is "any of these"):

=====================  ==========================================================================
key                    holds when
=====================  ==========================================================================
mode, layout, capture, the case's axis value is one of those listed
interleave, device
dtype, shape           the program's input dtype / shape is one of those listed
passing                some region is entered that way (positional, keyword, closure, list, dict,
                       autocast, sdpa_kernel)
op                     some site runs one of these ops (anywhere)
op_in_region           some site inside a checkpointed region runs one of these ops
op_outside             some site outside every region (drawn in forward only) runs one of these
op_nested              some site inside a region nested in another region runs one of these
site_in_region         some site inside a region runs this op in this dtype ("sdpa_efficient.bf16")
site_in_sdpa_kernel    some site inside a region entered under sdpa_kernel (its inner regions' sites
                       included: their forward runs under it too) runs this op in this dtype: what a
                       recompute outside the context may run on another backend
first_draw_in_region   the first drawing site of some region (its inner regions' sites included:
                       they run inside it) runs one of these ops (what a policy saving a
                       region's first RNG op saves)
op_before_draw         some site of a region (its own) runs one of these ops and a site of that
                       region drawing with another op from the same stream comes after it (if a
                       policy saves the first op and recomputes the other, the other redraws
                       from a shifted position)
after_region           true: some site or region comes after a region, in the program or inside
                       a region (it runs between that region's forward and its recompute);
                       false: none does
nested                 true: some region holds another region; false: none does
regions_pending        the most regions whose recomputes are pending at once is at least this
                       (3: three levels deep or three siblings)
tracked_in_region      true: some site inside a region draws from a tracker stream (t, a, b,
                       as its own or as the layout gives it; a site that draws nothing does
                       not count); false: none does
draws_in_region        true: some site inside a region draws (not nodraw, not dropout with p = 0);
                       false: nothing inside a region draws
default_in_region      true: some site inside a region draws from the device's default generator
                       (d, as its own or as the layout gives it); false: none does
drawn_again_in_region  true: after some region's first draw (its inner regions' included) and up to
                       its last own site (where a non-reentrant recompute stops), a site draws
                       from that first draw's stream: a policy that saves the region's first RNG
                       op shifts it; false: nowhere
tracked_after_draw     true: such a later site draws from a tracker stream (so that policy
                       recomputes a tracked draw)
fused_attention_only   true: some site inside a region draws and every one that does runs fused
                       attention (sdpa_efficient, sdpa_flash, sdpa_cudnn: what a save list that
                       keeps those ops saves, so nothing is redrawn); false: otherwise
draws_outside          true: some site outside every region draws (in forward only, between
                       regions); false: none does
shared_input           true: one tensor feeds two items (a ``&`` in the spec: parallel regions or
                       sites) or is passed twice to a region (the ``twice`` passing); false: never
shared_input_regions   true: two regions receive one tensor (parallel regions: ``(A)&(B)``), so
                       anything a checkpoint keys by its input tensor collides; false: none do
iterations             the program runs at least this many iterations (named programs: 2)
=====================  ==========================================================================

`facts_of(case)` computes them once per case; `check_facts` validates an entry's.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Mapping

from . import ops
from .cases import AXES, Case
from .programs import TRACKER_STREAMS, Dtype, Op, Passing, Region, Shape, reading_groups

# Facts whose value is one of an enum's values (entry: a value or a list of values).
ENUM_FACTS: dict[str, type[enum.Enum]] = {
    "mode": AXES["mode"], "layout": AXES["layout"], "capture": AXES["capture"],
    "interleave": AXES["interleave"], "device": AXES["device"], "dtype": Dtype, "shape": Shape,
    "passing": Passing, "op": Op, "op_in_region": Op, "op_outside": Op, "op_nested": Op,
    "first_draw_in_region": Op, "op_before_draw": Op,
}
BOOL_FACTS = ("after_region", "nested", "tracked_in_region", "draws_in_region", "default_in_region",
              "draws_outside", "fused_attention_only", "drawn_again_in_region", "tracked_after_draw",
              "shared_input", "shared_input_regions")
FUSED_ATTENTION = frozenset([Op.SDPA_EFFICIENT, Op.SDPA_FLASH, Op.SDPA_CUDNN])
INT_FACTS = ("regions_pending", "iterations")
SITE_FACTS = ("site_in_region", "site_in_sdpa_kernel")  # "op.dtype" values
FACT_KEYS = (*ENUM_FACTS, *SITE_FACTS, *BOOL_FACTS, *INT_FACTS)


@dataclass(frozen=True)
class CaseFacts:
    """Everything an entry can ask of one case (`facts_of`)."""

    values: Mapping[str, frozenset[str]]  # ENUM_FACTS key -> the values the case has
    flags: Mapping[str, bool]  # BOOL_FACTS
    counts: Mapping[str, int]  # INT_FACTS


def _depth_sites(region: Region, depth: int) -> list[tuple[Any, int]]:
    """(site, depth of its region) for every site of `region` and of the regions inside it."""
    out = []
    for item in region.items:
        out.extend(_depth_sites(item, depth + 1) if isinstance(item, Region) else [(item, depth)])
    return out


def _after_region(items: tuple) -> bool:
    """Whether something follows a region among `items` (one level)."""
    first = next((n for n, item in enumerate(items) if isinstance(item, Region)), len(items))
    return len(items) > first + 1


def _pending(region: Region) -> int:
    """The most recomputes pending at once inside `region`: itself and its deepest nesting."""
    inner = [_pending(item) for item in region.items if isinstance(item, Region)]
    return 1 + max(inner, default=0)


@functools.lru_cache(maxsize=4096)
def facts_of(case: Case) -> CaseFacts:
    """The facts of `case` (cached: cases are frozen)."""
    program = case.program
    top = program.items()
    regions = [item for item in top if isinstance(item, Region)]
    inside = [pair for region in regions for pair in _depth_sites(region, 1)]
    outside = [item for item in top if not isinstance(item, Region)]
    streams = case.streams()  # every site's stream, its own or the layout's
    drawing_inside = [site for site, _ in inside if ops.REGISTRY[site.op].draws]
    in_region_ops = {site.op.value for site, _ in inside}
    # A region's own sites, not its inner regions' (each inner region is a checkpoint of its own,
    # with its own selective policy: a nested region's ops are not the outer policy's to save).
    own = [[item for item in region.items if not isinstance(item, Region)] for region in program.all_regions()]
    region_draws = [[site for site in region.sites() if ops.REGISTRY[site.op].draws]
                    for region in program.all_regions()]
    # A saved RNG op shifts only the later draws of its own stream (a tracked draw does not move
    # the default generator): what follows must draw from the same stream to be shifted.
    before_draw = {site.op.value for sites in own for n, site in enumerate(sites)
                   if any(ops.REGISTRY[later.op].draws and later.op is not site.op
                          and streams[later.name] == streams[site.name] for later in sites[n + 1:])}
    # The draws after a region's first draw (its inner regions' count: they run inside it, and
    # the outer policy sees their ops first) that its recompute reruns: what a policy saving each
    # region's first RNG op recomputes, shifted when they draw from that first draw's stream.
    # A non-reentrant recompute stops after the last tensor its region saved itself (torch's early
    # stop), i.e. at the region's last own site: inner regions' draws before it are rerun too.
    again, tracked_after = False, False
    for region in program.all_regions():
        order = region.sites()
        mine = {id(item) for item in region.items if not isinstance(item, Region)}
        last_own = max((n for n, site in enumerate(order) if id(site) in mine), default=-1)
        drawing = [(n, streams[site.name]) for n, site in enumerate(order[:last_own + 1])
                   if ops.REGISTRY[site.op].draws]
        for _, stream in drawing[1:]:
            again = again or stream == drawing[0][1]
            tracked_after = tracked_after or stream in TRACKER_STREAMS
    values = {
        "mode": frozenset([case.mode.value]), "layout": frozenset([case.layout.value]),
        "capture": frozenset([case.capture.value]), "interleave": frozenset([case.interleave.value]),
        "device": frozenset([case.device.value]), "dtype": frozenset([program.dtype.value]),
        "shape": frozenset([program.shape.value]),
        "passing": frozenset(p.value for p in program.passings()),
        "op": frozenset(op.value for op in program.ops()),
        "op_in_region": frozenset(in_region_ops),
        "op_outside": frozenset(site.op.value for site in outside),
        "op_nested": frozenset(site.op.value for site, depth in inside if depth >= 2),
        "site_in_region": frozenset(f"{site.op.value}.{site.dtype.value}" for site, _ in inside),
        "site_in_sdpa_kernel": frozenset(f"{site.op.value}.{site.dtype.value}" for region in program.all_regions()
                                         if region.passing is Passing.SDPA_KERNEL for site in region.sites()),
        "first_draw_in_region": frozenset(draws[0].op.value for draws in region_draws if draws),
        "op_before_draw": frozenset(before_draw),
    }
    flags = {
        "after_region": any(_after_region(items) for items in program.item_lists()),
        "nested": any(depth >= 2 for _, depth in inside) or any(
            isinstance(inner, Region) for region in program.all_regions() for inner in region.items),
        "tracked_in_region": any(streams[site.name] in TRACKER_STREAMS for site in drawing_inside),
        "draws_in_region": bool(drawing_inside),
        "default_in_region": any(streams[site.name] == "d" for site in drawing_inside),
        "draws_outside": any(ops.REGISTRY[site.op].draws for site in outside),
        "fused_attention_only": bool(drawing_inside) and all(site.op in FUSED_ATTENTION for site in drawing_inside),
        "drawn_again_in_region": again,
        "tracked_after_draw": tracked_after,
        "shared_input": Passing.TWICE in program.passings() or any(
            item.parallel for items in program.item_lists() for item in items),
        "shared_input_regions": any(
            sum(isinstance(item, Region) for item in group) >= 2
            for items in program.item_lists() for group in reading_groups(items)),
    }
    # Regions pending at once: the nesting depth, or siblings at the top (each sibling's recompute
    # waits for backward), whichever is more.
    counts = {"regions_pending": max(len(regions), max((_pending(r) for r in regions), default=0)),
              "iterations": program.iterations}
    return CaseFacts(values, flags, counts)


def check_facts(raw: Mapping[str, Any], where: str, error: type[Exception]) -> dict[str, Any]:
    """An entry's facts, validated: enum facts as frozensets of values, bools, ints; anything
    malformed raises `error` with one line."""
    out: dict[str, Any] = {}
    for key in FACT_KEYS:
        if key not in raw:
            continue
        value = raw[key]
        if key in ENUM_FACTS or key in SITE_FACTS:
            items = value if isinstance(value, list) else [value]
            known = ([v.value for v in ENUM_FACTS[key]] if key in ENUM_FACTS
                     else [f"{op.value}.{dtype.value}" for op in Op for dtype in Dtype])
            bad = [v for v in items if v not in known]
            if not items or bad:
                raise error(f"{where} {key} {bad[0] if bad else value!r} is none of {', '.join(known)}")
            out[key] = frozenset(items)
        elif key in BOOL_FACTS:
            if not isinstance(value, bool):
                raise error(f"{where} {key} must be true or false, not {value!r}")
            out[key] = value
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise error(f"{where} {key} must be a positive integer, not {value!r}")
            out[key] = value
    return out


def missed(facts: Mapping[str, Any], case: Case) -> list[str]:
    """The entry facts `case` does not have, one phrase each ('layout is shared, not tracked or
    mixed'); [] when every fact holds."""
    have = facts_of(case)
    out = []
    for key, wanted in facts.items():
        if key in ENUM_FACTS or key in SITE_FACTS:
            got = have.values[key]
            if not got & wanted:
                shown = ", ".join(sorted(got)) or "none"
                out.append(f"{key} is {shown}, not {' or '.join(sorted(wanted))}")
        elif key in BOOL_FACTS:
            if have.flags[key] != wanted:
                out.append(f"{key} is {str(have.flags[key]).lower()}")
        elif have.counts[key] < wanted:
            out.append(f"{key} is {have.counts[key]}, not at least {wanted}")
    return out
