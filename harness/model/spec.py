"""Program specs: any region program as one line of text, and back (what the fuzzer prints).

A spec is an optional header, a colon, and the program's items joined by ``+`` (in order)::

    bf16.odd.x3:list(rand@t+dropout.f16+sdpa_kernel(sdpa_math))+bernoulli_@d

* header: the input's dtype (``f32`` when absent), the shape of every activation (``small`` when
  absent) and the number of iterations (``x2`` when absent, 2 to 9), joined by ``.``;
* a region is ``PASSING(items)``: a checkpointed function of the items inside, entered the way
  `Passing` names (no name: ``positional``; ``sdpa_kernel`` chooses the backend of the first
  attention site inside, around the region);
* a site is ``OP[.DTYPE][@STREAM]``: an op of `harness.model.ops`, the dtype it works in (the input's
  when absent) and the stream it draws from (``d`` the default generator, ``t`` the tracked
  stream, ``a`` and ``b`` the shared pair; when absent, the case's layout decides by the site's
  index, as for named programs);
* a site outside every region draws in forward only (a draw between checkpointed regions);
* items are joined by ``+`` (the next reads the output of the one before) or by ``&`` (the next
  reads the same input as the one before, and their outputs are added): ``(dropout)&(dropout)``
  feeds two regions from one tensor, as attention and MLP branches read one normalised input;
* the ``twice`` passing hands the region one tensor as two arguments (``twice(dropout)``);
* ``save(sites)`` inside a region marks a SAVE region: sites joined by ``+`` whose activations a
  checkpoint may keep instead of recomputing (torch_remat's ``region(..., recompute=False)``: a
  draw there is not made again in the recompute); for every other impl only an annotation.  It
  holds sites only, and is read as one item by the items around it (``&save(...)`` holds one).

`format_spec` writes the canonical form (defaults left out); `parse_spec(format_spec(p))` is a
program equal to ``p`` and `format_spec` of it is the same text.  Every named program has a spec
(``Program.spec``): ``flat`` is ``(native_dropout+native_dropout)``.  Specs use no ``-``, so a
case id (``mode-layout-capture-SPEC-interleave-device``) still splits into its six parts, and no
``,``, so a comma list of programs still splits into programs; quote them in a shell
(parentheses).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Iterator

from .programs import (
    CLASSIC,
    DEFAULT_ITERATIONS,
    FACTORS,
    SDPA_OPS,
    STREAMS,
    Dtype,
    Item,
    Nesting,
    Op,
    Passing,
    Program,
    ProgramError,
    Region,
    Shape,
    Site,
    Tree,
    format_spec,
    parse_enum,
    parse_factor,
)

MAX_ITERATIONS = 9
MAX_DEPTH = 32  # regions inside regions: deeper is refused in one line (no RecursionError, no stack blow-up)
_TOKEN = re.compile(r"\s*(?:([a-z0-9_]+)|(.))")


@dataclass(frozen=True)
class SpecProgram(Tree):
    """A program given by a spec: any tree of regions and sites (`items()`), the input's dtype,
    the shape of every activation and the iteration count."""

    tree: tuple[Item, ...]
    shape: Shape = Shape.SMALL
    dtype: Dtype = Dtype.F32
    iterations: int = DEFAULT_ITERATIONS  # type: ignore[assignment]

    def items(self) -> tuple[Item, ...]:
        return self.tree

    @property
    def name(self) -> str:
        return format_spec(self)

    # The factors of a named program, where this one has a single value (markers and filters).
    @property
    def op(self) -> Op | None:
        ops = self.ops()
        return next(iter(ops)) if len(ops) == 1 else None

    @property
    def passing(self) -> Passing | None:
        passings = self.passings()
        return next(iter(passings)) if len(passings) == 1 else None

    @property
    def nesting(self) -> None:
        return None


class _Parser:
    """Recursive descent over the tokens of one spec; errors name the column."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [(m.group(1) or m.group(2), m.start(1) if m.group(1) else m.start(2))
                       for m in _TOKEN.finditer(text) if m.group(1) or m.group(2)]
        self.at = 0
        self.depth = 0

    def fail(self, what: str) -> ProgramError:
        column = self.tokens[self.at][1] + 1 if self.at < len(self.tokens) else len(self.text) + 1
        return ProgramError(f"bad program spec {self.text!r}: {what} at column {column} "
                            "(e.g. bf16.x3:list(rand@t+dropout)+bernoulli_)")

    def peek(self) -> str | None:
        return self.tokens[self.at][0] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise self.fail(f"expected {expected!r}" if expected else "unexpected end")
        self.at += 1
        return token

    def word(self, what: str) -> str:
        token = self.peek()
        if token is None or not re.fullmatch(r"[a-z0-9_]+", token):
            raise self.fail(f"expected {what}")
        self.at += 1
        return token

    def items(self, closing: str | None) -> list:
        out = [(*self.item(), False)]  # each node ends with whether it is parallel
        while self.peek() in ("+", "&"):
            parallel = self.take() == "&"  # '&': reads the same input as the item before it
            if parallel and out[-1][0] == "save" and len(out[-1][1]) > 1:
                raise self.fail("'save(...)&' needs a SAVE region of one site (the item after '&' would read "
                                "the output of its first site, not its input)")
            out.append((*self.item(), parallel))
        if self.peek() != closing:
            raise self.fail(f"expected '+', '&' or {closing!r}" if closing else "expected '+', '&' or the end")
        return out

    def item(self) -> tuple:
        if self.peek() == "(":
            return self.region(Passing.POSITIONAL)
        name = self.word("a site or a region")
        if name == "save" and self.peek() == "(":
            return self.save()
        if self.peek() == "(":
            return self.region(self.enum(Passing, "passing", name))
        op = self.enum(Op, "op", name)
        dtype = stream = None
        if self.peek() == ".":
            self.take(".")
            dtype = self.enum(Dtype, "dtype", self.word("a dtype"))
        if self.peek() == "@":
            self.take("@")
            stream = self.word("a stream")
            if stream not in STREAMS:
                self.at -= 1
                raise self.fail(f"unknown stream {stream!r} (streams: {', '.join(STREAMS)})")
        return ("site", op, dtype, stream)

    def save(self) -> tuple:
        """``save(site+site...)``: a SAVE region of sites, in order (no '&', no region inside)."""
        self.take("(")
        sites = [self.site_in_save()]
        while self.peek() == "+":
            self.take("+")
            sites.append(self.site_in_save())
        if self.peek() != ")":
            raise self.fail("expected '+' or ')' (a SAVE region holds sites joined by '+')")
        self.take(")")
        return ("save", sites)

    def site_in_save(self) -> tuple:
        if self.peek() == "(":
            raise self.fail("a SAVE region holds sites only, not a region")
        node = self.item()
        if node[0] != "site":
            raise self.fail("a SAVE region holds sites only")
        return node

    def region(self, passing: Passing) -> tuple:
        if self.depth >= MAX_DEPTH:
            raise self.fail(f"regions nested more than {MAX_DEPTH} deep")
        self.take("(")
        self.depth += 1
        items = self.items(")")
        self.depth -= 1
        self.take(")")
        return ("region", passing, items)

    def enum(self, enum_type: type, name: str, value: str):  # type: ignore[no-untyped-def]
        try:
            return parse_enum(enum_type, name, value, ProgramError)
        except ProgramError as exc:
            self.at -= 1
            raise self.fail(str(exc)) from None


def _header(text: str, spec: str) -> tuple[Dtype, Shape, int]:
    dtype, shape, iterations = Dtype.F32, Shape.SMALL, DEFAULT_ITERATIONS
    for option in filter(None, (part.strip() for part in text.split("."))):
        if option in {d.value for d in Dtype}:
            dtype = Dtype(option)
        elif option in {s.value for s in Shape}:
            shape = Shape(option)
        elif re.fullmatch(r"x\d+", option) and 2 <= int(option[1:]) <= MAX_ITERATIONS:
            iterations = int(option[1:])
        else:
            raise ProgramError(f"bad program spec {spec!r}: unknown header option {option!r} (a dtype: "
                               f"{', '.join(d.value for d in Dtype)}; a shape: {', '.join(s.value for s in Shape)}; "
                               f"iterations x2 to x{MAX_ITERATIONS})")
    return dtype, shape, iterations


def parse_spec(text: str) -> SpecProgram:
    """The program a spec describes; a malformed spec raises `ProgramError` (one line)."""
    header, _, body = text.strip().rpartition(":")
    dtype, shape, iterations = _header(header, text)
    parser = _Parser(body)
    if parser.peek() is None:
        raise ProgramError(f"bad program spec {text!r}: no sites or regions")
    raw = parser.items(None)
    sites, regions, saves = itertools.count(), itertools.count(), itertools.count()

    def site(node: tuple, backend: Op | None, parallel: bool, save: "int | None") -> Site:
        index = next(sites)
        _, op, site_dtype, stream = node[:4]
        return Site(f"s{index}", op, index, site_dtype or dtype, stream, backend is None, parallel, save)

    def build(node: tuple, backend: Op | None) -> list[Item]:
        if node[0] == "site":
            return [site(node, backend, node[4], None)]
        if node[0] == "save":
            _, members, parallel = node
            if parallel and len(members) > 1:
                raise ProgramError(f"bad program spec {text!r}: '&save(...)' holds one site (several would "
                                   "read each other's output, not the input of the item before)")
            number = next(saves)
            return [site(member, backend, parallel and n == 0, number) for n, member in enumerate(members)]
        _, passing, inner, parallel = node
        name = f"r{next(regions)}"  # before the inner regions, as named programs number them
        if passing is Passing.SDPA_KERNEL and backend is None:
            backend = next((op for op in _ops(inner) if op in SDPA_OPS), None) or Op.SDPA_MATH
            # (no attention site inside: cases.RULES refuses the program; math keeps it buildable)
        items = tuple(item for child in inner for item in build(child, backend))
        return [Region(name, items, passing, backend if passing is Passing.SDPA_KERNEL else None, parallel)]

    return SpecProgram(tuple(item for node in raw for item in build(node, None)), shape, dtype, iterations)


def _ops(nodes: list) -> Iterator[Op]:
    for node in nodes:
        if node[0] == "site":
            yield node[1]
        elif node[0] == "save":
            yield from (member[1] for member in node[1])
        else:
            yield from _ops(node[2])


def parse_program(name: str) -> Tree:
    """A program from its name (`Program.name`: a nesting alone, or five dotted factors) or its
    spec (`harness.model.spec`: anything with a parenthesis, ``+``, ``@`` or ``:``)."""
    if any(mark in name for mark in "()+&@:"):
        return parse_spec(name)
    parts = name.strip().split(".")
    if len(parts) == 1:
        try:
            return Program(*CLASSIC, parse_factor("nesting", parts[0]))  # type: ignore[arg-type]
        except ProgramError:
            raise ProgramError(f"unknown program {name.strip()!r}: a program is a nesting "
                               f"({', '.join(n.value for n in Nesting)}), {'.'.join(FACTORS)} "
                               "(e.g. rand.bf16.odd.keyword.deep) or a spec (e.g. '(native_dropout+rand)')") from None
    if len(parts) != len(FACTORS):
        raise ProgramError(f"bad program {name!r}: expected a nesting ({', '.join(n.value for n in Nesting)}) "
                           f"or {'.'.join(FACTORS)} (e.g. rand.bf16.odd.keyword.deep)")
    return Program(*(parse_factor(factor, part) for factor, part in zip(FACTORS, parts)))  # type: ignore[arg-type]
