"""What an impl declares it cannot run, as data (issue 57, item 5).

An adapter's `supports(case)` answers for one case; the fuzzer needs to know beforehand which
values to draw.  An adapter whose limits are values of one axis each (no reentrant form, no nested
regions, no CUDA-graph capture, no attention sites, ...) declares them here, once, as `Limit`s
returned by its ``declared_limits()``, and its `supports` answers from them (`declared`): the
fuzzer (`harness.fronts.fuzz`) draws only the values they leave (`allowed`), and no second copy of
an impl's limits exists to drift.  Limits that depend on several axes at once, on the machine or on
a process group stay code in `supports`; the fuzzer asks `supports` for those before it runs a
program (`harness.run.execution.declined`).

No torch here: a `Limit` reads only the case's axes and its program's tree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..model.cases import Case
from ..model.programs import Region


class Axis(enum.Enum):
    """What a `Limit` excludes values of.  The first four are the case's own axes (one value per
    case); ``passing`` and ``op`` are the program's (a case hits a limit on them when any region
    is entered with, or any site runs, an excluded value); ``nesting`` is whether any region lies
    inside another (its only values are True and False)."""

    MODE = "mode"
    LAYOUT = "layout"
    CAPTURE = "capture"
    DEVICE = "device"
    PASSING = "passing"
    OP = "op"
    NESTING = "nesting"


CASE_AXES = (Axis.MODE, Axis.LAYOUT, Axis.CAPTURE, Axis.DEVICE)


@dataclass(frozen=True)
class Limit:
    """One declared limit: the values of `axis` the impl cannot run, and why (the reason its
    `supports` gives for a case with any of them)."""

    axis: Axis
    excluded: frozenset[Any]
    reason: str

    def hit(self, case: Case) -> bool:
        """Whether `case` has one of the excluded values."""
        return not self.excluded.isdisjoint(values_of(case, self.axis))


def limit(axis: Axis, excluded: Iterable[Any], reason: str) -> Limit:
    """A `Limit` of `axis` excluding `excluded` (any iterable of the axis's values)."""
    return Limit(axis, frozenset(excluded), reason)


def nested(program: Any) -> bool:
    """Whether a region of `program` holds another region."""
    return any(isinstance(item, Region) for region in program.all_regions() for item in region.items)


def values_of(case: Case, axis: Axis) -> frozenset[Any]:
    """The values `case` has on `axis`: one for the case's own axes; every region's passing, every
    site's op; ``{True}`` or ``{False}`` for nesting."""
    if axis in CASE_AXES:
        return frozenset({getattr(case, axis.value)})
    if axis is Axis.PASSING:
        return case.program.passings()
    if axis is Axis.OP:
        return case.program.ops()
    return frozenset({nested(case.program)})


def declared(limits: Sequence[Limit], case: Case) -> str | None:
    """The reason of the first of `limits` that `case` hits, or None (the case is inside them)."""
    for one in limits:
        if one.hit(case):
            return one.reason
    return None


def allowed(limits: Sequence[Limit], axis: Axis, values: Iterable[Any]) -> list[Any]:
    """`values` (in their order) without those any of `limits` excludes on `axis`."""
    excluded = frozenset().union(*(one.excluded for one in limits if one.axis is axis))
    return [value for value in values if value not in excluded]


def of(adapter: Any) -> tuple[Limit, ...]:
    """The limits `adapter` declares (``declared_limits()``; none for an adapter without the
    method, or one whose method raises or answers with anything but `Limit`s: its `supports`
    still answers for every case it runs)."""
    method = getattr(adapter, "declared_limits", None)
    if not callable(method):
        return ()
    try:
        answer = tuple(method())
    except Exception:  # a broken declaration declares nothing; supports() still guards each case
        return ()
    return answer if all(isinstance(one, Limit) for one in answer) else ()



def describe(limits: Sequence[Limit]) -> str:
    """The values `limits` exclude, for a person: 'mode not reentrant; no region inside a region'."""
    parts = []
    for one in limits:
        if one.axis is Axis.NESTING:
            parts.append("no region inside a region")
        else:
            values = sorted(getattr(value, "value", str(value)) for value in one.excluded)
            parts.append(f"{one.axis.value} not {'/'.join(values)}")
    return "; ".join(parts)
