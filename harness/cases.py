"""The case matrix: axes as enums, a frozen `Case`, readable ids, and `generate()`.

A case id joins the axis values in a fixed order with '-', e.g.
``nonreentrant-tracked-eager-nested-draws-cpu``; every value uses only ``[a-z0-9]`` so ids are safe
for ``pytest -k`` and shell copy-paste.  Invalid combinations are never generated: `RULES` prunes
them, and `parse_case_id` refuses them too.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, fields
from typing import Callable, Iterable, Iterator, Mapping


class CaseError(ValueError):
    """A bad axis value, filter or case id; the message is one line meant for the user."""


class Mode(enum.Enum):
    """Checkpoint flavour (``use_reentrant=True/False`` in PyTorch terms)."""

    REENTRANT = "reentrant"
    NONREENTRANT = "nonreentrant"


class Layout(enum.Enum):
    """Which RNG streams the sites of a region draw from."""

    DEFAULT = "default"  # all sites on the default generator, tracker present but unused by sites
    TRACKED = "tracked"  # all sites inside tracker.fork(name)
    MIXED = "mixed"  # sites alternate default and tracked
    SHARED = "shared"  # two tracker names alias one generator state; sites alternate the names
    UNTRACKED = "untracked"  # no tracker at all; sites on the default generator


class Capture(enum.Enum):
    """How the workload is executed: eagerly or inside CUDA graphs."""

    EAGER = "eager"
    SEPARATE = "separate"  # forward graph + backward graph, replayed in order
    SINGLE = "single"  # forward and backward captured in one graph


class Nesting(enum.Enum):
    """How checkpointed regions are arranged."""

    FLAT = "flat"  # one region
    NESTED = "nested"  # a region inside a region
    SIBLINGS = "siblings"  # two regions one after the other


class Interleave(enum.Enum):
    """What happens between forward and backward."""

    NONE = "none"
    DRAWS = "draws"  # draw from every live stream, as other micro-batches would


class Device(enum.Enum):
    """The device type the workload runs on."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, order=False)
class Case:
    """One point of the cross product of the axes.  Field order is the id order."""

    mode: Mode
    layout: Layout
    capture: Capture
    nesting: Nesting
    interleave: Interleave
    device: Device

    @property
    def id(self) -> str:
        """The readable, shell-safe id, e.g. ``reentrant-mixed-eager-flat-none-cpu``."""
        return "-".join(getattr(self, f.name).value for f in fields(self))

    def axis_values(self) -> dict[str, str]:
        """Axis name -> value string, in id order."""
        return {f.name: getattr(self, f.name).value for f in fields(self)}

    def __str__(self) -> str:
        return self.id


# Axis name -> enum, in id order (the order of Case's fields).
AXES: dict[str, type[enum.Enum]] = {
    "mode": Mode,
    "layout": Layout,
    "capture": Capture,
    "nesting": Nesting,
    "interleave": Interleave,
    "device": Device,
}

# A rule returns None for a valid case, or the reason it is invalid.
Rule = Callable[[Case], "str | None"]

RULES: tuple[Rule, ...] = (
    lambda c: (
        "CUDA graph capture needs a cuda device"
        if c.capture is not Capture.EAGER and c.device is not Device.CUDA
        else None
    ),
)


def invalid_reason(case: Case) -> str | None:
    """Return why `case` is not a valid combination, or None if it is valid."""
    for rule in RULES:
        reason = rule(case)
        if reason:
            return reason
    return None


def _valid_values(axis: str) -> str:
    return ", ".join(v.value for v in AXES[axis])


def parse_value(axis: str, value: "str | enum.Enum") -> enum.Enum:
    """Turn ``'tracked'`` (or an enum member) into the member of `axis`; unknown -> CaseError."""
    if axis not in AXES:
        raise CaseError(f"unknown axis {axis!r}; axes are: {', '.join(AXES)}")
    enum_type = AXES[axis]
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(str(value).strip().lower())
    except ValueError:
        raise CaseError(
            f"unknown {axis} {value!r}; valid values: {_valid_values(axis)}"
        ) from None


def _as_values(axis: str, wanted: object) -> list[enum.Enum]:
    """Normalise a filter: a value, a comma list string, or an iterable of values."""
    if isinstance(wanted, (str, enum.Enum)):
        items: Iterable[object] = str(wanted).split(",") if isinstance(wanted, str) else [wanted]
    else:
        items = wanted  # type: ignore[assignment]
    values = list(dict.fromkeys(parse_value(axis, item) for item in items if str(item).strip()))
    if not values:
        raise CaseError(f"empty filter for {axis}; valid values: {_valid_values(axis)}")
    return values


def generate(**filters: object) -> Iterator[Case]:
    """Yield every valid case, in a stable order, restricted by ``axis=value(s)`` filters.

    A filter value may be an enum member, a value string, a comma-separated string or an iterable
    of these.  Unknown axes or values raise `CaseError` naming the valid ones.
    """
    choices: dict[str, list[enum.Enum]] = {}
    for axis, enum_type in AXES.items():
        wanted = filters.pop(axis, None)
        choices[axis] = list(enum_type) if wanted is None else _as_values(axis, wanted)
    if filters:
        raise CaseError(f"unknown axis {sorted(filters)[0]!r}; axes are: {', '.join(AXES)}")
    return _valid_cases(choices)  # filters are checked above, before the first case is asked for


def _valid_cases(choices: dict[str, list[enum.Enum]]) -> Iterator[Case]:
    for combo in itertools.product(*choices.values()):
        case = Case(**dict(zip(choices, combo)))  # type: ignore[arg-type]
        if invalid_reason(case) is None:
            yield case


def parse_case_id(case_id: str) -> Case:
    """Parse an id made by `Case.id` back into a `Case`; bad ids raise `CaseError`."""
    parts = case_id.strip().split("-")
    if len(parts) != len(AXES):
        raise CaseError(
            f"bad case id {case_id!r}: expected {len(AXES)} parts "
            f"{'-'.join(AXES)} (e.g. nonreentrant-tracked-eager-nested-draws-cpu)"
        )
    case = Case(**{axis: parse_value(axis, part) for axis, part in zip(AXES, parts)})  # type: ignore[arg-type]
    reason = invalid_reason(case)
    if reason:
        raise CaseError(f"invalid case {case_id!r}: {reason}")
    return case


def filters_from_mapping(mapping: Mapping[str, object]) -> dict[str, object]:
    """Keep only the entries of `mapping` that name an axis and are set (for CLI/pytest options)."""
    return {axis: mapping[axis] for axis in AXES if mapping.get(axis)}
