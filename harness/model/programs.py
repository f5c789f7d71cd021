"""Region programs: what a case runs, as data (the default matrix: README, opening section).

A program is a tree of checkpointed regions and sites.  It is named by five factors:

* ``op``: the RNG consumer of its sites (`harness.model.ops`; ``nodraw`` alternates a site that draws
  nothing with a dropout site);
* ``dtype``: of the activations, weights and RNG outputs (``f32``, ``bf16``, ``f16``);
* ``shape``: of the activation every site works on: ``small`` 64x64, ``odd`` 63x65 (an odd element
  count) or ``large`` 1024x1024 (2^20 elements: CUDA's Philox offset moves by a different amount
  per call than for the small shapes);
* ``passing``: how a region receives its input (``positional``, ``keyword``, ``closure``, inside a
  ``list`` or a ``dict``), or the context it is entered under that backward does not have
  (``autocast``: bfloat16 autocast, each region starting with a matmul that autocast affects;
  ``sdpa_kernel``: the attention backend chosen around the region rather than around the op);
* ``nesting``: the tree (``flat``, ``nested``, ``siblings``, ``deep``: three levels, ``wide``: three
  sibling regions, whose recomputes are all pending at once).

Spec programs (`harness.model.spec`) add what named programs lack: per-site ops, dtypes and streams,
sites between regions, more iterations, and items fed from one tensor (``&``: a parallel branch;
the ``twice`` passing: one tensor as two arguments).

A program's name is its five factors joined by '.', e.g. ``rand.bf16.odd.keyword.deep``, except that
the programs of the first matrix (one or two ``native_dropout`` sites per region, float32 64x64,
positional input) are named by their nesting alone (``flat``, ``nested``, ``siblings``, and so
``deep`` and ``wide``): every case id of that matrix still names the same case.  Which stream a site
draws from is the case's layout, not the program's (`cases.layout_stream`).
"""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass
from typing import Iterable, Iterator, Union

from ..axes import Dtype, Nesting, Op, Passing, Shape
from ..errors import UsageError

DEFAULT_ITERATIONS = 2  # a program runs forward and backward this many times unless its spec says


# Factor name -> enum, in name order.
FACTORS: dict[str, type[enum.Enum]] = {
    "op": Op, "dtype": Dtype, "shape": Shape, "passing": Passing, "nesting": Nesting,
}

SHAPES = {Shape.SMALL: (64, 64), Shape.ODD: (63, 65), Shape.LARGE: (1024, 1024)}
# The (batch, heads, sequence, head dim) view an attention site takes of the activation.
ATTENTION_VIEWS = {Shape.SMALL: (1, 1, 64, 64), Shape.ODD: (1, 1, 63, 65), Shape.LARGE: (1, 16, 256, 256)}
TORCH_DTYPES = {Dtype.F32: "float32", Dtype.BF16: "bfloat16", Dtype.F16: "float16"}
SDPA_OPS = (Op.SDPA_MATH, Op.SDPA_EFFICIENT, Op.SDPA_FLASH, Op.SDPA_CUDNN)
NO_DRAW_OPS = (Op.NODRAW, Op.DROPOUT_P0, Op.SDPA_AUTO)  # their named programs alternate them with native_dropout
# The factors of the first matrix's programs, named by their nesting alone.
CLASSIC = (Op.NATIVE_DROPOUT, Dtype.F32, Shape.SMALL, Passing.POSITIONAL)
# Each nesting's tree: a list per top-level region, holding its sites ("s") and inner regions.
TREES = {
    Nesting.FLAT: [["s", "s"]],
    Nesting.NESTED: [["s", ["s", "s"], "s"]],
    Nesting.SIBLINGS: [["s", "s"], ["s", "s"]],
    Nesting.DEEP: [["s", ["s", ["s", "s"], "s"], "s"]],
    Nesting.WIDE: [["s", "s"], ["s", "s"], ["s", "s"]],
}


class ProgramError(UsageError):
    """A bad program name or factor value; the message is one line meant for the user."""


# Where a site draws from, as a spec writes it (`harness.model.spec`): the device's default generator,
# the tracked stream, Megatron's context-parallel or model-and-context-parallel stream (seeded per
# CP rank, per TP and CP rank: `rank_context`), or one of the shared pair (b is an alias of a).  A
# site without one draws from what the case's layout gives its index (`cases.layout_stream`).
STREAMS = {"d": "the default generator", "t": "the tracked stream", "c": "the context-parallel stream",
           "m": "the model-and-context-parallel stream", "a": "shared stream a",
           "b": "shared stream b (an alias of a)"}
DEFAULT_STREAM = "d"
# Under `--ranks` the streams seeded per rank, by code, and the axes their seeds depend on (by
# name: `rank_context.STREAM_AXES`).
PER_RANK_AXES = {"t": ("tp",), "c": ("cp",), "m": ("tp", "cp")}


def per_rank_codes(sizes: "dict[str, int]", along: "Iterable[str] | None" = None) -> frozenset[str]:
    """The stream codes whose seeds differ between some ranks of a layout of these axis `sizes`
    (only along the axes `along`, where given: ranks that differ on those axes alone)."""
    wanted = set(along) if along is not None else {"tp", "cp"}
    return frozenset(code for code, axes in PER_RANK_AXES.items()
                     if any(sizes[axis] > 1 for axis in axes if axis in wanted))
TRACKER_STREAMS = frozenset(STREAMS) - {DEFAULT_STREAM}  # the streams a tracker holds


@dataclass(frozen=True)
class Site:
    """One RNG consumer: its name (s0, s1, ... in execution order), op, index, the dtype it works
    in, where it draws from (a `STREAMS` code; None: the case's layout decides) and whether it
    chooses its own attention backend (False inside an ``sdpa_kernel`` region)."""

    name: str
    op: Op
    index: int
    dtype: Dtype = Dtype.F32
    stream: "str | None" = None
    own_backend: bool = True
    # True: reads the same input as the item before it (a parallel branch, as attention and MLP
    # both read one normalised tensor) and its output is added to that item's (spec: ``&``).
    parallel: bool = False
    # The SAVE region (numbered in program order) the site belongs to, None outside any: a part of
    # a checkpointed region whose activations a checkpoint may keep instead of recomputing
    # (torch_remat's ``region(..., recompute=False)``); for every other impl only an annotation
    # (spec: ``save(...)``).
    save: "int | None" = None


@dataclass(frozen=True)
class Region:
    """A checkpointed function made of sites and inner regions, in order, entered the way its
    `passing` says (``sdpa_kernel``: under the backend of `backend`, an attention op)."""

    name: str
    items: tuple[Union[Site, "Region"], ...]
    passing: Passing = Passing.POSITIONAL
    backend: "Op | None" = None
    parallel: bool = False  # as `Site.parallel`: several regions fed from one tensor

    def sites(self) -> list[Site]:
        """Every site of this region and of the regions inside it, in execution order."""
        out: list[Site] = []
        for item in self.items:
            out.extend(item.sites() if isinstance(item, Region) else [item])
        return out

    def regions(self) -> Iterator["Region"]:
        """This region, then the regions inside it, depth first."""
        yield self
        for item in self.items:
            if isinstance(item, Region):
                yield from item.regions()


Item = Union[Site, Region]


def reading_groups(items: "tuple[Item, ...]") -> "Iterator[list[Item]]":
    """`items` split into the groups that read one tensor: an item and the parallel items after it."""
    group: list[Item] = []
    for item in items:
        if group and not item.parallel:
            yield group
            group = []
        group.append(item)
    if group:
        yield group


class Tree:
    """What every program offers the workload, all read from its top-level `items()` (regions,
    and for spec programs sites outside any region).

    A subclass defines `items()`, `shape`, `dtype` (of the input), `iterations` and `name`.
    """

    shape: Shape
    dtype: Dtype

    @property
    def iterations(self) -> int:
        return DEFAULT_ITERATIONS

    def items(self) -> tuple[Item, ...]:
        raise NotImplementedError

    @property
    def shape_dims(self) -> tuple[int, int]:
        return SHAPES[self.shape]

    # What the case rules, the runner and the workload read of every case: computed once per
    # program (subclasses are frozen dataclasses; cached_property fills their instance __dict__).
    @functools.cached_property
    def _regions(self) -> tuple[Region, ...]:
        return tuple(item for item in self.items() if isinstance(item, Region))

    @functools.cached_property
    def _sites(self) -> tuple[Site, ...]:
        return tuple(site for item in self.items() for site in (item.sites() if isinstance(item, Region) else [item]))

    @functools.cached_property
    def _all_regions(self) -> tuple[Region, ...]:
        return tuple(inner for region in self._regions for inner in region.regions())

    def regions(self) -> tuple[Region, ...]:
        """The top-level regions (sites s0, s1, ... and regions r0, r1, ... depth first)."""
        return self._regions

    def sites(self) -> list[Site]:
        """Every site, checkpointed or not, in execution order."""
        return list(self._sites)

    def checkpointed_sites(self) -> list[Site]:
        """The sites inside a checkpointed region."""
        return [site for region in self._regions for site in region.sites()]

    def all_regions(self) -> list[Region]:
        return list(self._all_regions)

    def item_lists(self) -> "list[tuple[Item, ...]]":
        """Every sequence of items: the top level's, then each region's (depth first)."""
        return [self.items(), *(region.items for region in self._all_regions)]

    @functools.cached_property
    def _op_dtypes(self) -> tuple[tuple[Op, Dtype], ...]:
        return tuple(dict.fromkeys((site.op, site.dtype) for site in self._sites))

    def ops(self) -> frozenset[Op]:
        """Every op a site of this program runs."""
        return frozenset(op for op, _ in self._op_dtypes)

    def op_dtypes(self) -> tuple[tuple[Op, Dtype], ...]:
        """Every (op, dtype) a site of this program runs, once each, in site order."""
        return self._op_dtypes

    def passings(self) -> frozenset[Passing]:
        """Every passing a region of this program is entered with."""
        return frozenset(region.passing for region in self._all_regions)

    @property
    def spec(self) -> str:
        """The program as a spec (`harness.model.spec`): it parses back to a program that runs the same."""
        return format_spec(self)

    def __str__(self) -> str:
        return self.name  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Program(Tree):
    """A workload named by its five factors; `items()` is its tree (every site has the program's
    op, dtype and passing; every site is inside a region)."""

    op: Op
    dtype: Dtype
    shape: Shape
    passing: Passing
    nesting: Nesting

    @property
    def name(self) -> str:
        """``flat`` for the first matrix's programs, else ``op.dtype.shape.passing.nesting``."""
        if (self.op, self.dtype, self.shape, self.passing) == CLASSIC:
            return self.nesting.value
        return ".".join(value.value for value in self.factors().values())

    def factors(self) -> dict[str, enum.Enum]:
        return {name: getattr(self, name) for name in FACTORS}

    def site_op(self, index: int) -> Op:
        if self.op in NO_DRAW_OPS:  # a site that draws nothing beside one that does
            return self.op if index % 2 == 0 else Op.NATIVE_DROPOUT
        return self.op

    def items(self) -> tuple[Item, ...]:
        """The top-level regions, sites numbered s0, s1, ... in execution order and regions r0,
        r1, ... depth first (outer before inner)."""
        return self._tree

    @functools.cached_property
    def _tree(self) -> tuple[Item, ...]:
        # Built once per program: the case rules read the tree of every case a matrix considers
        # (a frozen dataclass still has an instance __dict__ for cached_property to fill).
        sites, regions = itertools.count(), itertools.count()
        kernel = self.passing is Passing.SDPA_KERNEL
        backend = self.op if kernel else None

        def build(items: list) -> Region:
            name = f"r{next(regions)}"  # before the inner regions: outer regions number first
            built: list[Item] = []
            for item in items:
                if isinstance(item, list):
                    built.append(build(item))
                else:
                    index = next(sites)
                    built.append(Site(f"s{index}", self.site_op(index), index, self.dtype, None, not kernel))
            return Region(name, tuple(built), self.passing, backend)

        return tuple(build(region) for region in TREES[self.nesting])


def parse_enum(enum_type: type[enum.Enum], name: str, value: "str | enum.Enum",
               error: type[ValueError]) -> enum.Enum:
    """`value` (a member, or its value string in any case, spaces around) as a member of
    `enum_type`; otherwise `error` naming `name` and the valid values, in one line."""
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(str(value).strip().lower())
    except ValueError:
        valid = ", ".join(v.value for v in enum_type)
        raise error(f"unknown {name} {value!r}; valid values: {valid}") from None


def parse_factor(name: str, value: "str | enum.Enum") -> enum.Enum:
    """``('op', 'rand')`` -> `Op.RAND`; an unknown value raises `ProgramError`."""
    return parse_enum(FACTORS[name], name, value, ProgramError)


def every_program() -> Iterator[Program]:
    """Every combination of factor values (validity against a case is `cases.invalid_reason`)."""
    for values in itertools.product(*FACTORS.values()):
        yield Program(*values)  # type: ignore[arg-type]


def format_spec(program: Tree) -> str:
    """The canonical spec of `program` (a named program or a `SpecProgram`)."""
    header = [value for value, default in ((program.dtype, Dtype.F32), (program.shape, Shape.SMALL))
              if value is not default]
    if program.iterations != DEFAULT_ITERATIONS:
        header.append(f"x{program.iterations}")

    def item(it: Item) -> str:
        if isinstance(it, Region):
            prefix = "" if it.passing is Passing.POSITIONAL else it.passing.value
            return f"{prefix}({sequence(it.items)})"
        text = it.op.value
        if it.dtype is not program.dtype:
            text += f".{it.dtype.value}"
        return text + (f"@{it.stream}" if it.stream else "")

    def sequence(items: "tuple[Item, ...]") -> str:
        out: list[str] = []
        for n, it in enumerate(items):
            joint = "" if n == 0 else "&" if it.parallel else "+"
            save = getattr(it, "save", None)
            before = getattr(items[n - 1], "save", None) if n else None
            after = getattr(items[n + 1], "save", None) if n + 1 < len(items) else None
            opened = save is not None and save != before
            closed = save is not None and save != after
            out.append(f"{joint}{'save(' if opened else ''}{item(it)}{')' if closed else ''}")
        return "".join(out)

    body = sequence(program.items())
    return f"{'.'.join(h if isinstance(h, str) else h.value for h in header)}:{body}" if header else body
