"""The case matrix: axes as enums, a frozen `Case`, readable ids, and `generate()`.

A case is a region program (`harness.model.programs`) run in one checkpoint mode, stream layout, capture
mode and interleave on one device.  Its id joins mode, layout, capture, program name, interleave
and device with '-', e.g. ``nonreentrant-tracked-eager-nested-draws-cpu`` or
``reentrant-mixed-single-rand.bf16.odd.keyword.deep-none-cuda``; ids use only ``[a-z0-9_.-]``, so
they are safe for ``pytest -k`` and shell copy-paste.  Invalid combinations are never generated:
`RULES` prunes them, and `parse_case_id` refuses them too.

Two matrices: ``default`` (the first matrix's three programs over every axis value, plus a
generated covering set of programs in which every value of every program factor meets every
layout, capture mode and checkpoint mode at least once; `covering`) and ``full`` (every valid
program over every axis value).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from ..axes import (
    AXES,
    Capture,
    Device,
    Dtype,
    Interleave,
    Layout,
    Mode,
    Nesting,
    Op,
    Passing,
    Shape,
)
from ..errors import UsageError
from . import ops
from .programs import (
    SDPA_OPS,
    Program,
    ProgramError,
    Region,
    parse_enum,
    reading_groups,
)
from .spec import parse_program

__all__ = ["AXES", "Case", "CaseError", "Capture", "Device", "Dtype", "Interleave", "Layout",
           "Mode", "Nesting", "Op", "Passing", "Program", "Shape", "parse_case_id"]


class CaseError(UsageError):
    """A bad axis value, filter or case id; the message is one line meant for the user."""


# The parts of a case id, in order.
ID_PARTS = ("mode", "layout", "capture", "program", "interleave", "device")


@dataclass(frozen=True, order=False)
class Case:
    """One program under one mode, layout, capture and interleave on one device (id order)."""

    mode: Mode
    layout: Layout
    capture: Capture
    program: Program
    interleave: Interleave
    device: Device

    @property
    def id(self) -> str:
        """The readable, shell-safe id, e.g. ``reentrant-mixed-eager-flat-none-cpu``."""
        return "-".join(self.program.name if part == "program" else getattr(self, part).value
                        for part in ID_PARTS)

    # The program's factors.  A spec program (`harness.model.spec`) has a factor only where all its
    # sites or regions share one value (op, passing) and never a nesting: None there.
    @property
    def op(self) -> Op | None:
        return self.program.op

    @property
    def dtype(self) -> Dtype:
        return self.program.dtype

    @property
    def shape(self) -> Shape:
        return self.program.shape

    @property
    def passing(self) -> Passing | None:
        return self.program.passing

    @property
    def nesting(self) -> Nesting | None:
        return self.program.nesting

    def axis_values(self) -> dict[str, str]:
        """Every axis and program factor -> its value string (`AXES` order; '' for a factor a
        spec program has no single value of), and ``program``."""
        values = {axis: getattr(getattr(self, axis), "value", "") for axis in AXES}
        return {**values, "program": self.program.name}

    def streams(self) -> dict[str, str]:
        """Site name -> the stream it draws from, as a `programs.STREAMS` code: the site's own,
        else what the layout gives its index."""
        return {site.name: site.stream or layout_stream(self.layout, site.index) for site in self.program.sites()}

    def __str__(self) -> str:
        return self.id


# A rule returns None for a valid case, or the reason it is invalid.
Rule = Callable[[Case], "str | None"]

def layout_stream(layout: Layout, index: int) -> str:
    """The stream (a `programs.STREAMS` code) `layout` gives site number `index`."""
    if layout in (Layout.DEFAULT, Layout.UNTRACKED):
        return "d"
    if layout is Layout.TRACKED:
        return "t"
    if layout is Layout.MIXED:
        return "dt"[index % 2]
    return "ab"[index % 2]  # Layout.SHARED


# The streams a layout's sites may draw from.  The layout in a case id says what the sites do,
# also for spec programs whose sites name their streams (`_stream_reason`).
LAYOUT_STREAMS = {
    Layout.DEFAULT: "d", Layout.UNTRACKED: "d", Layout.TRACKED: "tcm", Layout.MIXED: "dtcm", Layout.SHARED: "dtab",
}


def _op_reason(c: Case) -> str | None:
    for op, dtype in c.program.op_dtypes():
        reason = ops.invalid_reason(op, dtype, c.shape, c.device.value)
        if reason:
            return reason
    return None


def _kernel_reason(c: Case) -> str | None:
    """An sdpa_kernel region needs attention inside, all of it on the backend it chooses."""
    for region in c.program.all_regions():
        if region.passing is not Passing.SDPA_KERNEL:
            continue
        attention = {site.op for site in region.sites() if site.op in SDPA_OPS}
        if not attention:
            return "the sdpa_kernel context only matters to an attention op"
        if attention != {region.backend}:
            return (f"region {region.name} chooses {region.backend.value if region.backend else '?'}'s backend "
                    f"around attention sites of {', '.join(sorted(op.value for op in attention))}")
    for backend, dtype in kernel_auto_attention(c.program):
        # sdpa_auto runs on whatever backend the flags allow: inside the region, only the chosen one
        reason = ops.invalid_reason(backend, dtype, c.shape, c.device.value)
        if reason:
            return f"an sdpa_auto site runs on the backend its sdpa_kernel region chooses, and {reason}"
    return None


def kernel_auto_attention(program: "Program") -> "list[tuple[Op, Dtype]]":
    """(backend op, dtype) of every ``sdpa_auto`` site inside an ``sdpa_kernel`` region: such a site
    chooses no backend of its own, so it runs on the one its region's context allows."""
    return [(region.backend, site.dtype) for region in program.all_regions()
            if region.passing is Passing.SDPA_KERNEL and region.backend is not None
            for site in region.sites() if site.op is Op.SDPA_AUTO]


def _stream_reason(c: Case) -> str | None:
    allowed = LAYOUT_STREAMS[c.layout]
    streams = set(c.streams().values())
    odd = sorted(streams - set(allowed))
    if odd:
        return (f"the {c.layout.value} layout's sites draw from {' or '.join(allowed)}, but a site of the "
                f"program draws from {odd[0]}: the case's layout must name what its sites do")
    if c.layout is Layout.MIXED and not {"d", "t"} <= streams:
        return "the mixed layout needs sites drawing from both d and t"
    if c.layout is Layout.SHARED and not streams & {"a", "b"}:
        return "the shared layout needs a site drawing from a or b"
    return None


def _readers(item: object) -> int:
    """How many gradient contributions the item's input receives from inside it in a run without
    checkpoint: a site reads it once, a region as often as its first items do (twice for the twice
    passing, once under autocast: its matmul reads it)."""
    if not isinstance(item, Region):
        return 1
    if item.passing is Passing.AUTOCAST:
        return 1
    if item.passing is Passing.TWICE:
        return 2
    return sum(_readers(inner) for inner in next(reading_groups(item.items)))


def _fan_in_reason(c: Case) -> str | None:
    """A reentrant checkpoint runs its region's backward as a separate graph and hands its input one
    summed gradient: where that input also feeds other items, the contributions are added in
    another grouping than without checkpoint, and float addition of three or more terms in another
    grouping changes last bits.  Such a difference is no RNG bug (torch's reentrant checkpoint
    makes it too), and no bit-exact oracle could judge the case."""
    if c.mode is not Mode.REENTRANT:
        return None
    for group in (g for items in c.program.item_lists() for g in reading_groups(items)):
        total = sum(_readers(item) for item in group)
        # (a twice region hands back one gradient per argument, as the run without checkpoint has)
        split = [item for item in group if isinstance(item, Region) and item.passing is not Passing.TWICE
                 and 2 <= _readers(item) < total]
        if total >= 3 and split:
            return (f"a reentrant checkpoint of region {split[0].name} sums the gradients of its input's "
                    f"{_readers(split[0])} readers inside it before the other readers' ({total} in all): "
                    "float addition in another grouping than without checkpoint, not an RNG difference")
    return None


def _save_reason(c: Case) -> str | None:
    """A SAVE region marks part of a checkpointed region: outside every region there is nothing to
    recompute or keep."""
    outside = [item for item in c.program.items() if not isinstance(item, Region) and item.save is not None]
    if outside:
        return (f"site {outside[0].name} is in a SAVE region outside every checkpointed region: save(...) "
                "marks part of a region")
    return None


RULES: tuple[Rule, ...] = (
    lambda c: (
        "CUDA graph capture needs a cuda device"
        if c.capture is not Capture.EAGER and c.device is not Device.CUDA
        else None
    ),
    lambda c: None if c.program.regions() else "a program needs a checkpointed region",
    _op_reason,
    lambda c: (
        "a reentrant checkpoint differentiates only the tensors passed to it: a region whose input "
        "comes through a closure has no gradient path"
        if c.mode is Mode.REENTRANT and Passing.CLOSURE in c.program.passings() else None
    ),
    _kernel_reason,
    _stream_reason,
    _fan_in_reason,
    _save_reason,
)


def invalid_reason(case: Case) -> str | None:
    """Return why `case` is not a valid combination, or None if it is valid."""
    for rule in RULES:
        reason = rule(case)
        if reason:
            return reason
    return None


def valid_values(axis: str) -> str:
    """The values of `axis`, comma-separated (for messages)."""
    return ", ".join(v.value for v in AXES[axis])


def parse_value(axis: str, value: "str | enum.Enum") -> enum.Enum:
    """Turn ``'tracked'`` (or an enum member) into the member of `axis`; unknown -> CaseError."""
    if axis not in AXES:
        raise CaseError(f"unknown axis {axis!r}; axes are: {', '.join(AXES)}")
    return parse_enum(AXES[axis], axis, value, CaseError)


def parse_case_id(case_id: str) -> Case:
    """Parse an id made by `Case.id` back into a `Case`; bad ids raise `CaseError`."""
    parts = case_id.strip().split("-")
    if len(parts) != len(ID_PARTS):
        raise CaseError(
            f"bad case id {case_id!r}: expected {len(ID_PARTS)} parts "
            f"{'-'.join(ID_PARTS)} (e.g. nonreentrant-tracked-eager-nested-draws-cpu)"
        )
    values: dict[str, object] = {}
    for part, text in zip(ID_PARTS, parts):
        if part == "program":
            try:
                values[part] = parse_program(text)
            except ProgramError as exc:
                raise CaseError(f"bad case id {case_id!r}: {exc}") from None
        else:
            values[part] = parse_value(part, text)
    case = Case(**values)  # type: ignore[arg-type]
    reason = invalid_reason(case)
    if reason:
        raise CaseError(f"invalid case {case_id!r}: {reason}")
    return case

