"""Known bugs as models (issue 40): a named behaviour with parameters says what a checkpoint does
differently in a case, and from that which error it raises or which oracles fail.

An expectation entry names a behaviour instead of a predicate over facts::

    [[expect]]
    name = "torch-ignores-tracker"
    impl = ["torch", "torch-partial"]
    model = { behaviour = "unsaved-streams", streams = ["tracker"] }
    reason = "..."

Its facts (mode, device, ...), where it has any, only scope it; the behaviour decides, case by
case, whether the bug can show and how.  The library (`BEHAVIOURS`):

``unsaved-streams`` (``streams``: ``tracker``, ``device``, ``cpu``; ``passing``: only regions
    entered so)
    the checkpoint neither saves nor restores these streams: a recompute draws them from where
    they are live, and leaves them advanced.
``refuses-input`` (``passing``, ``message``)
    the checkpoint raises when a region is entered that way (the forward stops there).
``input-invisible`` (``passing``, ``message``; reentrant cases only)
    an autograd Function differentiates only its direct tensor arguments: a region entered that
    way gets no gradient path, its recompute never runs and nothing upstream of it gets a
    gradient; backward raises where the loss, or an enclosing reentrant region's output, no
    longer requires grad (``message`` matches both errors).
``context-not-replayed`` (``context``: ``sdpa_kernel`` or ``autocast``; ``message``)
    the recompute runs outside the context the region was entered under: an attention site runs
    on the backend torch picks by itself on this machine (`Machine.backend`); the matmul an
    autocast region starts with runs in the program's dtype.  Where that changes anything, a
    non-reentrant recompute raises where the entry gives a ``message`` (torch's metadata check,
    selective checkpointing's storage lookup), and otherwise the gradients differ (and a mask
    where the changed site draws).
``skips-save-regions`` (``restored``)
    a SAVE region's body (``save(...)`` sites, torch_remat's ``recompute=False``) is not rerun in the
    recompute: its draws are not made again; the streams its hooks snapshot are put back after it.
``saved-rng-ops`` (``ops``, ``first = true`` or ``every = true``; ``mutated_message``)
    a selective policy saves these RNG ops' outputs (or every region's first RNG op, its inner
    regions' included; or every RNG op): the recompute does not rerun them, so every later draw of the same stream
    in that recompute comes from a shifted position; where the saved output is then changed in
    place (`IN_PLACE`), selective checkpointing raises (``mutated_message``).

`predict` composes every behaviour an impl has in a case: the first error wins (forward before
backward; at the start of backward before any recompute; then in the order backward recomputes
the regions), else the union of the failed oracles.  The draws are replayed by a small
simulation (`replay`): streams as counters, the reference run and the checkpointed run side by
side, per iteration, with the checkpoint's snapshots, recomputes (non-reentrant ones stop after
the region's last own site) and restores.  A model that predicts no failure does not claim the
case: where it passes, it passes; where it fails, nothing explains it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..errors import UsageError
from ..model import ops
from ..model.cases import Case
from ..model.programs import NO_DRAW_OPS, SDPA_OPS, Op, Passing, Region, Site, reading_groups

BEHAVIOURS = {
    "unsaved-streams": {"streams", "passing"},
    "refuses-input": {"passing", "message"},
    "input-invisible": {"passing", "message"},
    "context-not-replayed": {"context", "message"},
    "saved-rng-ops": {"ops", "first", "every", "mutated_message"},
    "not-restored": {"streams"},
    "extra-draw": {"streams"},
    "rewound-after-forward": {"streams"},
    "snapshot-slots": {"slots"},
    "snapshots-frozen": {"after_steps"},
    "inert-fork": {"message"},
    "leaks-ambient": {"undone_by"},
    "skips-save-regions": {"restored"},
    "early-stop": set(),
}
REQUIRED = {"unsaved-streams": {"streams"}, "refuses-input": {"passing", "message"},
            "input-invisible": {"passing", "message"}, "context-not-replayed": {"context"},
            "saved-rng-ops": set(), "not-restored": {"streams"}, "extra-draw": {"streams"}, "early-stop": set(),
            "rewound-after-forward": {"streams"}, "snapshot-slots": {"slots"},
            "snapshots-frozen": {"after_steps"}, "inert-fork": {"message"}, "leaks-ambient": set(),
            "skips-save-regions": set()}
STREAM_KINDS = ("tracker", "device", "cpu", "all")
CONTEXTS = ("sdpa_kernel", "autocast")
ATTENTION = frozenset([*SDPA_OPS, Op.SDPA_AUTO])
# Ops whose RNG output the op itself changes in place right after drawing (bernoulli_ then div_),
# per device type: what selective checkpointing refuses to hand back from its cache.  On the CPU
# F.dropout and the math attention's dropout fill a bernoulli_ noise tensor and scale it in place.
IN_PLACE = {
    "cpu": frozenset([Op.BERNOULLI, Op.NORMAL, Op.UNIFORM, Op.EXPONENTIAL, Op.DROPOUT_INPLACE, Op.DROPOUT,
                      Op.SDPA_MATH]),
    "cuda": frozenset([Op.BERNOULLI, Op.NORMAL, Op.UNIFORM, Op.EXPONENTIAL, Op.DROPOUT_INPLACE]),
}
State = defaultdict  # stream -> the draws it made, in order (`replay`)
# Ops whose record is the draw itself (a mask, a random tensor, sampled indices): a stream at the
# same state draws the same record again.  The others record their output, which depends on their
# input as well (F.dropout, attention): the same mask under another input is no stale record.
RECORDS_THE_DRAW = frozenset(op.value for op in (
    Op.NATIVE_DROPOUT, Op.BERNOULLI, Op.RAND, Op.RANDN, Op.RAND_LIKE, Op.RANDN_LIKE, Op.RANDINT, Op.NORMAL,
    Op.UNIFORM, Op.MULTINOMIAL, Op.RANDPERM, Op.POISSON, Op.EXPONENTIAL))
TRACKER_CODES = frozenset("tab")  # the stream codes a tracker holds (`programs.STREAMS`)
PINNED = {Op.SDPA_MATH: "math", Op.SDPA_EFFICIENT: "efficient", Op.SDPA_FLASH: "flash", Op.SDPA_CUDNN: "cudnn"}
# Error phases, in the order they happen (the earliest wins).
FORWARD, BACKWARD_START, RECOMPUTE = 0, 1, 2


class ModelError(UsageError):
    """A malformed model table; the message is one line."""


@dataclass(frozen=True)
class Model:
    """A behaviour of the library and its parameters (as the entry wrote them, validated)."""

    behaviour: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={_param(v)}" for k, v in self.params if not k.endswith("message"))
        return f"{self.behaviour}({shown})"


def _param(value: Any) -> str:
    if isinstance(value, tuple):
        return "|".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_model(raw: Any, where: str) -> Model:
    """An entry's ``model`` table -> `Model`; anything malformed raises `ModelError` (one line)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("behaviour"), str):
        raise ModelError(f"{where} model must be a table with a behaviour ({', '.join(BEHAVIOURS)})")
    name = raw["behaviour"]
    if name not in BEHAVIOURS:
        raise ModelError(f"{where} model behaviour {name!r} is none of {', '.join(BEHAVIOURS)}")
    keys = set(raw) - {"behaviour"}
    unknown = sorted(keys - BEHAVIOURS[name])
    if unknown:
        raise ModelError(f"{where} model {name} has no parameter {unknown[0]!r}; its parameters: "
                         f"{', '.join(sorted(BEHAVIOURS[name]))}")
    missing = sorted(REQUIRED[name] - keys)
    if missing:
        raise ModelError(f"{where} model {name} needs {', '.join(missing)}")
    params: dict[str, Any] = {}
    for key in sorted(keys):
        value = raw[key]
        if key in ("message", "mutated_message"):
            import re

            if not isinstance(value, str):
                raise ModelError(f"{where} model {key} must be a string (a regular expression)")
            try:
                re.compile(value)
            except re.error as exc:
                raise ModelError(f"{where} model {key} {value!r} is not a regular expression: {exc}") from None
            params[key] = value
        elif key in ("slots", "after_steps"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"{where} model {key} must be a positive integer, not {value!r}")
            params[key] = value
        elif key in ("first", "every"):
            if not isinstance(value, bool):
                raise ModelError(f"{where} model {key} must be true or false")
            params[key] = value
        else:
            known = {"streams": STREAM_KINDS, "restored": STREAM_KINDS, "passing": [p.value for p in Passing],
                     "context": CONTEXTS,
                     "ops": [o.value for o in Op], "undone_by": [p.value for p in Passing]}[key]
            items = value if isinstance(value, list) else [value]
            bad = [v for v in items if v not in known]
            if not items or bad:
                raise ModelError(f"{where} model {key} {bad[0] if bad else value!r} is none of {', '.join(known)}")
            params[key] = tuple(items)
    if name == "saved-rng-ops" and [bool(params.get("ops")), bool(params.get("first")),
                                    bool(params.get("every"))].count(True) != 1:
        raise ModelError(f"{where} model saved-rng-ops needs one of ops (a list), first = true or every = true")
    return Model(name, tuple(params.items()))


class Machine:
    """What the installed torch does on the machine a case ran on, as far as models ask: the
    attention backend it picks when no context chooses.  Answers come from `known` (a record's
    ``machine_facts``) or, where `probe` is set, from asking torch here (`ops.default_backend`);
    every answer given is kept in `asked`, for the record."""

    def __init__(self, known: Mapping[str, Any] | None = None, probe: bool = True) -> None:
        self.known = dict(known or {})
        self.probe = probe
        self.asked: dict[str, Any] = {}

    def backend(self, device: str, site: Site, shape: Any) -> "str | None":
        """The backend an attention site of this dtype and shape runs on by itself (None: unknown)."""
        dropout = ops.REGISTRY[site.op].draws
        key = f"sdpa.{device}.{site.dtype.value}.{shape.value}.{'dropout' if dropout else 'no-dropout'}"
        if key in self.known:
            value = self.known[key]
        elif self.probe:
            value = ops.default_backend(device, site.dtype, shape, dropout)
        else:
            value = None
        self.asked[key] = value
        return value


LOCAL = Machine()


@dataclass
class Frame:
    """One checkpoint call in the replay: its snapshot, and where the impl keeps it (a slot of a
    fixed pool, the ordinal of the call in its step), None where it keeps its own."""

    state: Any
    slot: "int | None" = None
    ordinal: "int | None" = None


@dataclass(frozen=True)
class Raised:
    """An error a behaviour predicts: when (phase, then the rank of the region whose recompute
    raises, then the site in it), what, and why."""

    phase: int
    order: int
    message: str
    why: str
    at: int = -1  # the site's index where a site raises


@dataclass
class Effects:
    """What the behaviours of one impl do in one case, before the replay."""

    unsaved: list[tuple[frozenset[str], "frozenset[Passing] | None", int]] = field(default_factory=list)
    saved_sites: dict[int, dict[str, int]] = field(default_factory=dict)  # region -> site -> entry index
    invisible: dict[Passing, tuple[int, str]] = field(default_factory=dict)  # -> entry index, its message
    reached: "set[int] | None" = None  # the regions a reentrant backward recomputes (None: all)
    invisible_index: int = -1  # the entry whose invisible region keeps others from being recomputed
    not_restored: dict[str, int] = field(default_factory=dict)  # stream -> entry index
    extra: dict[str, int] = field(default_factory=dict)  # stream -> entry index
    rewound: dict[str, int] = field(default_factory=dict)  # stream -> entry index
    slots: "tuple[int, int] | None" = None  # `snapshot-slots`: how many, entry index
    frozen: "tuple[int, int] | None" = None  # `snapshots-frozen`: refreshed in this many steps, entry index
    # `skips-save-regions`: the streams its hooks put back after each SAVE region, entry index
    save_skip: "tuple[frozenset[str], int] | None" = None
    early_stop: bool = False
    raised: list[tuple[Raised, int]] = field(default_factory=list)
    mismatch: dict[str, set[int]] = field(default_factory=dict)  # oracle -> entry indexes
    why: dict[int, list[str]] = field(default_factory=dict)

    def fails(self, oracle: str, index: int, why: str = "") -> None:
        self.mismatch.setdefault(oracle, set()).add(index)
        if why:
            self.why.setdefault(index, []).append(why)


@dataclass(frozen=True)
class Prediction:
    """What the models of an impl say a case does: ``pass``, a ``mismatch`` with the oracles that
    must fail, or an ``error`` whose text matches `message`; the entries (indexes into the
    list given to `predict`) whose behaviour decides it, the first one deciding, and why."""

    outcome: str
    oracles: tuple[str, ...] = ()
    message: str = ""
    causes: tuple[int, ...] = ()
    why: tuple[str, ...] = ()


def _stream_key(code: str, device: str) -> str:
    """A site's stream code as the generator it draws from (b is an alias of a; on the CPU the
    device's default generator is the CPU generator)."""
    if code == "b":
        return "a"
    if code == "d":
        return "cpu" if device == "cpu" else "d"
    return code


def _kinds(streams: Iterable[str], device: str) -> frozenset[str]:
    out = set()
    for kind in streams:
        if kind == "all":
            out |= {"t", "a", "cpu", "d"}
        elif kind == "tracker":
            out |= {"t", "a"}
        elif kind == "device":
            out.add("cpu" if device == "cpu" else "d")
        else:
            out.add("cpu")
    return frozenset(out)


def _draws(site: Site) -> bool:
    return ops.REGISTRY[site.op].draws


def _pinned(program: Any) -> dict[str, Op]:
    """Site name -> the attention backend (an op) the innermost sdpa_kernel region around it pins."""
    out: dict[str, Op] = {}
    for region in program.all_regions():  # outer before inner: the inner context wins
        if region.passing is Passing.SDPA_KERNEL and region.backend is not None:
            out.update({site.name: region.backend for site in region.sites()})
    return out


def _own_op(site: Site, pinned: dict[str, Op]) -> Op:
    """The attention op a site runs in its forward: the pinned backend under sdpa_kernel."""
    if site.op in ATTENTION and not site.own_backend and site.name in pinned:
        return pinned[site.name]
    return site.op


def _backward_order(items: Sequence[Any]) -> list[Region]:
    """The regions in the order backward recomputes them: the last top-level region first, each
    region before the regions inside it (they recompute within its backward)."""
    out: list[Region] = []
    for region in reversed([item for item in items if isinstance(item, Region)]):
        out.append(region)
        out.extend(_backward_order(region.items))
    return out


def _unpack_order(program: Any) -> list[Region]:
    """The order in which a non-reentrant backward recomputes the regions: each region's frame
    recomputes when backward first needs a tensor it saved itself, i.e. at its last own site
    (inner regions' tensors are their own frames'), the latest first; a region with no own site
    saves nothing and never recomputes on its own."""
    owned = []
    for region in program.all_regions():
        own = [float(item.index) for item in region.items if isinstance(item, Site)]
        sites = region.sites()
        if region.passing is Passing.AUTOCAST and sites:
            own.append(sites[0].index - 0.5)  # the matmul an autocast region starts with saves its input
        if own:
            owned.append((max(own), region))
    return [region for _, region in sorted(owned, key=lambda pair: pair[0], reverse=True)]


def _enclosing(items: Sequence[Any], parent: "Region | None" = None) -> dict[int, "Region | None"]:
    out: dict[int, Region | None] = {}
    for item in items:
        if isinstance(item, Region):
            out[id(item)] = parent
            out.update(_enclosing(item.items, item))
    return out


def _effects(models: Sequence[Model], case: Case, machine: Machine) -> Effects:
    device, reentrant = case.device.value, case.mode.value == "reentrant"
    program = case.program
    effects = Effects()
    ranked = _backward_order(program.items()) if reentrant else _unpack_order(program)
    ranked += [r for r in program.all_regions() if r not in ranked]  # no own site: never on their own
    order = {id(r): n for n, r in enumerate(ranked)}
    for region in program.all_regions():  # outer before inner: a site's innermost region recomputes it
        for site in region.sites():
            order[site.name] = order[id(region)]
    for index, model in enumerate(models):
        name = model.behaviour
        if name == "unsaved-streams":
            passing = model.get("passing")
            effects.unsaved.append((_kinds(model.get("streams"), device),
                                    frozenset(Passing(p) for p in passing) if passing else None, index))
        elif name == "saved-rng-ops":
            message = model.get("mutated_message")
            for region in program.all_regions():
                chosen = _saved_sites(region, model, case, machine)
                for site in chosen:
                    effects.saved_sites.setdefault(id(region), {}).setdefault(site.name, index)
                hit = next((site for site in chosen if site.op in IN_PLACE.get(device, ())), None)
                if message and hit:
                    effects.raised.append((Raised(RECOMPUTE, order[hit.name], message,
                                                  f"{hit.name} ({hit.op.value}) is saved by the policy of "
                                                  f"{region.name} and changed in place after", hit.index), index))
        elif name == "refuses-input":
            passings = {Passing(p) for p in model.get("passing")}
            for region in program.all_regions():  # the first such region entered in forward raises
                if region.passing in passings:
                    effects.raised.append((Raised(FORWARD, 0, model.get("message"),
                                                  f"{region.name} is entered {region.passing.value}"), index))
                    break
        elif name == "input-invisible" and reentrant:
            for passing in model.get("passing"):
                effects.invisible.setdefault(Passing(passing), (index, model.get("message")))
        elif name == "context-not-replayed":
            _context_effects(case, machine, model, index, order, effects, reentrant)
        elif name == "not-restored":
            for stream in _kinds(model.get("streams"), device):
                effects.not_restored.setdefault(stream, index)
        elif name == "extra-draw":
            for stream in _kinds(model.get("streams"), device):
                effects.extra.setdefault(stream, index)
        elif name == "rewound-after-forward":
            for stream in _kinds(model.get("streams"), device):
                effects.rewound.setdefault(stream, index)
        elif name == "snapshot-slots":
            effects.slots = effects.slots or (model.get("slots"), index)
        elif name == "snapshots-frozen":
            effects.frozen = effects.frozen or (model.get("after_steps"), index)
        elif name == "inert-fork":
            code = case.streams()
            tracked = [site for site in program.sites() if _draws(site) and code[site.name] in TRACKER_CODES]
            if tracked or case.layout.value == "shared":
                why = (f"{tracked[0].name} draws from {code[tracked[0].name]}, but fork() switches to no stream"
                       if tracked else "the shared layout's alias probe forks both names")
                effects.raised.append((Raised(FORWARD, -1, model.get("message"), why), index))
        elif name == "leaks-ambient":
            undone = {Passing(p) for p in model.get("undone_by", ())}
            enclosing = _enclosing(program.items())
            for region in program.all_regions():
                walk, inside = region, False
                while walk is not None and not inside:
                    inside = walk.passing in undone
                    walk = enclosing.get(id(walk))
                if not inside:
                    effects.fails("ambient", index, f"{region.name}'s checkpoint leaves the leaked state behind"
                                  + (f" (no {'/'.join(sorted(p.value for p in undone))} context around it puts "
                                     "it back)" if undone else ""))
                    break
        elif name == "skips-save-regions":
            effects.save_skip = effects.save_skip or (_kinds(model.get("restored", ()), device), index)
        elif name == "early-stop":
            effects.early_stop = True
    if effects.invisible:
        _invisible_effects(program, effects, order)
    return effects


def _seeded(site: Site, pinned: dict[str, Op], case: Case, machine: Machine) -> bool:
    """Whether the op a site runs is one torch tags ``nondeterministic_seeded`` (what a selective
    policy counts as an RNG op): every drawing op, and attention without dropout where it runs
    on a fused kernel (flash, efficient, cuDNN take a dropout argument even at p = 0)."""
    if _draws(site):
        return True
    if site.op is not Op.SDPA_AUTO:
        return False
    own = _own_op(site, pinned)
    chosen = PINNED[own] if own in PINNED else machine.backend(case.device.value, site, case.shape)
    return chosen not in (None, "math")


def _saved_sites(region: Region, model: Model, case: Case, machine: Machine) -> list[Site]:
    """The drawing sites of `region` (its inner regions' included: they run inside its forward)
    whose output its selective policy saves, so that its recompute does not redraw them."""
    sites, pinned = region.sites(), _pinned(case.program)
    if model.get("every"):
        return [site for site in sites if _draws(site)]
    if model.get("first"):
        first = next((site for site in sites if _seeded(site, pinned, case, machine)), None)
        return [first] if first is not None and _draws(first) else []
    saved = {Op(o) for o in model.get("ops", ())}
    return [site for site in sites if _draws(site) and _own_op(site, pinned) in saved]


def _flow(items: Sequence[Any], incoming: bool, invisible: frozenset[Passing], out: dict[int, bool],
          body: dict[int, bool]) -> bool:
    """Whether the activation after `items` requires grad, given whether it did before them, in a
    reentrant case: a site multiplies by its weight (it does); a region's output requires grad only
    where a tensor argument it sees does.  Fills `out` (region -> its output requires grad) and
    `body` (region -> its body's output requires grad when its recompute runs it)."""
    for group in reading_groups(tuple(items)):
        results = []
        for item in group:
            if isinstance(item, Region):
                body[id(item)] = _flow(item.items, True, invisible, out, body)
                out[id(item)] = incoming and item.passing not in invisible
                results.append(out[id(item)])
            else:
                results.append(True)
        incoming = any(results)
    return incoming


def _invisible_effects(program: Any, effects: Effects, order: dict[Any, int]) -> None:
    """The errors and failures of regions whose input a reentrant checkpoint cannot see: backward
    raises where the loss, or a recomputed region's output, no longer requires grad; otherwise
    the regions no gradient reaches are never recomputed (their draws are missing from the
    recompute, their gradients and those upstream of them missing)."""
    invisible = frozenset(effects.invisible)
    hidden = [region for region in program.all_regions() if region.passing in invisible]
    if not hidden:
        return
    index, message = effects.invisible[hidden[0].passing]
    out: dict[int, bool] = {}
    body: dict[int, bool] = {}
    if not _flow(program.items(), True, invisible, out, body):
        effects.raised.append((Raised(BACKWARD_START, 0, message, "the loss does not require grad: nothing "
                                      f"after {hidden[0].name} (entered {hidden[0].passing.value}) carries a "
                                      "gradient"), index))
        return
    reached, _ = _reached(program.items(), True, invisible, out, body)
    for region in reached:
        if not body[id(region)]:
            effects.raised.append((Raised(RECOMPUTE, order[id(region)], message,
                                          f"{region.name}'s recompute output does not require grad"), index))
    effects.reached = {id(region) for region in reached}
    effects.fails("gradient", index, f"{hidden[0].name} is entered {hidden[0].passing.value}: it gets no gradient "
                  "path, so its gradients and those of everything upstream of it are missing")
    effects.invisible_index = index


def _reached(items: Sequence[Any], arrives: bool, invisible: frozenset[Passing], out: dict[int, bool],
             body: dict[int, bool]) -> tuple[list[Region], bool]:
    """The regions among `items` that a reentrant backward recomputes, given whether a gradient
    arrives after them, and whether one reaches their input: walking back from the end, a region
    gets a gradient where one arrives at its output and that output requires grad; it passes one
    on to its input only where it sees that input; a site always does.  A recomputed region's own
    items get one where its body's output requires grad (`_flow`)."""
    reached: list[Region] = []
    for group in reversed(list(reading_groups(tuple(items)))):
        passes = False
        for item in group:
            if isinstance(item, Region):
                if arrives and out[id(item)]:
                    reached.append(item)
                    reached.extend(_reached(item.items, body[id(item)], invisible, out, body)[0])
                    passes = passes or item.passing not in invisible
            else:
                passes = passes or arrives
        arrives = passes
    return reached, arrives


def _context_effects(case: Case, machine: Machine, model: Model, index: int, order: dict[Any, int],
                     effects: Effects, reentrant: bool) -> None:
    """What a recompute outside the region's context changes: under ``sdpa_kernel``, an attention
    site on another backend (this machine's own choice); under ``autocast``, the region's first
    matmul in the program's dtype instead of bfloat16 (nothing changes for a bfloat16 program).
    Non-reentrant with a ``message``, the recompute raises; otherwise other gradients (and another
    mask where the changed site draws)."""
    device, message = case.device.value, model.get("message")
    changed: list[tuple[Region, str, bool, "Site | None"]] = []  # region, why, whether a draw changes, site
    if model.get("context") == ("autocast",):
        if case.program.dtype.value != "bf16":
            changed += [(region, f"{region.name}'s matmul ran in bfloat16 under autocast in forward; the "
                                 f"recompute, outside it, runs it in {case.program.dtype.value}", False, None)
                        for region in case.program.all_regions() if region.passing is Passing.AUTOCAST]
    else:
        pinned_of = _pinned(case.program)
        for region in case.program.all_regions():
            if region.passing is not Passing.SDPA_KERNEL:
                continue
            for site in region.sites():
                if site.op not in ATTENTION or site.own_backend or site.name not in pinned_of:
                    continue
                pinned = PINNED.get(pinned_of[site.name])
                chosen = machine.backend(device, site, case.shape)
                if chosen is None or pinned is None or chosen == pinned:
                    continue
                changed.append((region, f"{site.name} ran on {pinned} under sdpa_kernel in forward; the recompute, "
                                        f"outside it, runs on {chosen} (this machine's choice for {site.dtype.value}"
                                        f"{' with dropout' if _draws(site) else ' without dropout'})", _draws(site),
                                site))
    for region, why, draws, site in changed:
        if message and not reentrant:
            rank = order[site.name] if site is not None else order[id(region)]
            effects.raised.append((Raised(RECOMPUTE, rank, message, why, site.index if site else -1), index))
        else:
            effects.fails("gradient", index, why)
            if draws:
                effects.fails("recompute-mask", index)


def replay(case: Case, effects: Effects, reached: "set[int] | None" = None) -> dict[str, set[int]]:
    """The draw simulation: oracle -> the entries (indexes) whose behaviour makes it fail, from
    the stream positions of the reference and the checkpointed run; the first such draw of each
    entry is described in ``effects.why``.  `reached`: the regions (ids) a reentrant backward
    recomputes (None: every region).

    A stream's state is the sequence of draws it has made (b is a's alias): two states are equal
    where the same draws were made in the same order (a count would call [A, B] and [B, A]
    equal).  Per iteration: the reference draws every site once; the checkpointed run draws the
    same sites, and each region's checkpoint takes its snapshot on entry (after an extra draw of
    its own, `extra-draw`; and puts the streams back on leaving, `rewound-after-forward`);
    between forward and backward the interleaved draws step every stream in both runs.  Backward
    recomputes the regions: reentrant, the last top-level region first, each followed by the
    inner regions its recompute made (their snapshots taken in it); non-reentrant, in
    `_unpack_order`, each from its forward snapshot.  A recompute rewinds the streams it saves
    to its snapshot, reruns its sites (all of them, or up to its last own site with
    `early-stop`), skips the draws its policy saved, and puts every stream it saves back where it
    was (not those `not-restored` leaves).  A rerun draw at another state than the forward's
    fails recompute-mask; a forward draw at another state than the reference's, forward-mask and
    output (and the same state as the iteration before, fresh-randomness, where the record is
    the draw itself); a stream that ends an iteration elsewhere, live-stream; any of these but
    live-stream, gradient."""
    notes: dict[int, str] = {}
    program, device = case.program, case.device.value
    reentrant = case.mode.value == "reentrant"
    early = effects.early_stop and not reentrant
    code = case.streams()
    key = {site.name: _stream_key(code[site.name], device) for site in program.sites()}
    token = {site.name: f"{site.op.value}.{site.dtype.value}" for site in program.sites()}
    enclosing = _enclosing(program.items())
    keys = {*key.values(), "cpu" if device == "cpu" else "d"}
    interleave = case.interleave.value == "draws"
    checkpointed = {site.name for site in program.checkpointed_sites() if site.save is None}

    def unsaved(region: Region) -> dict[str, int]:
        """Stream -> the entry that leaves it unsaved, for `region` and the regions around it
        (a recompute inside a region that left a stream live inherits that stream's shift)."""
        found: dict[str, int] = {}
        walk: Region | None = region
        while walk is not None:
            for streams, passings, index in effects.unsaved:
                if passings is None or walk.passing in passings:
                    for stream in streams:
                        found.setdefault(stream, index)
            walk = enclosing.get(id(walk))
        return found

    def fail(oracles: Sequence[str], cause: int) -> None:
        for oracle in oracles:
            causes.setdefault(oracle, set()).add(cause)

    # Where snapshots are kept (`snapshot-slots`, `snapshots-frozen`): a region's recompute
    # rewinds to what its ticket finds there, which may be another region's or step's state.
    slots: list[State] = [State(tuple)] * (effects.slots[0] if effects.slots else 0)
    pending: list[int] = []  # slots in use, oldest first
    by_ordinal: dict[int, State] = {}  # `snapshots-frozen`: the state kept per region call of a step
    step = {"number": 0, "ordinal": 0, "recomputing": 0}

    def enter(snapshots: dict[int, Frame], region: Region) -> None:
        """A checkpoint call: its extra draws, then its snapshot (and where it keeps it)."""
        for stream, index in effects.extra.items():
            ck[stream] += ("extra",)
            moved_by.setdefault(stream, index)
            notes.setdefault(index, f"{region.name}'s checkpoint draws from {stream} before its snapshot")
        frame = Frame(State(tuple, ck))
        if effects.slots:
            free = [n for n in range(len(slots)) if n not in pending]
            frame.slot = free[0] if free else pending.pop(0)  # no free slot: the oldest is overwritten
            slots[frame.slot] = frame.state
            pending.append(frame.slot)
        if effects.frozen and not step["recomputing"]:
            frame.ordinal = step["ordinal"]
            step["ordinal"] += 1
            if step["number"] < effects.frozen[0]:
                by_ordinal[frame.ordinal] = frame.state
        snapshots[id(region)] = frame

    def target(frame: Frame, region: Region) -> tuple[State, int]:
        """The state a recompute rewinds to, and the entry whose store gave another than its own."""
        found, index = frame.state, -1
        if frame.slot is not None:
            found = slots[frame.slot]
            if frame.slot in pending:
                pending.remove(frame.slot)
            index = effects.slots[1] if found is not frame.state else -1
        if frame.ordinal is not None and frame.ordinal in by_ordinal:
            found = by_ordinal[frame.ordinal]
            index = effects.frozen[1] if found is not frame.state else -1
        if index >= 0:
            notes.setdefault(index, f"{region.name}'s recompute rewinds to a snapshot another checkpoint call took")
        return found, index

    def leave(snapshots: dict[int, Frame], region: Region) -> None:
        """A checkpoint call returns: the streams `rewound-after-forward` puts back where it began."""
        began = snapshots[id(region)].state
        for stream, index in effects.rewound.items():
            if ck[stream] != began[stream]:
                ck[stream] = began[stream]
                moved_by.setdefault(stream, index)
                notes.setdefault(index, f"after {region.name}'s forward {stream} is put back where it was")

    causes: dict[str, set[int]] = {}
    ref, ck = State(tuple), State(tuple)
    moved_by: dict[str, int] = {}  # stream -> the entry whose behaviour first moved it off the reference
    last_fwd: dict[str, int] = {}
    for iteration in range(program.iterations):
        step.update(number=iteration, ordinal=0)
        ref_fwd: dict[str, int] = {}
        for site in program.sites():
            if _draws(site):
                ref_fwd[site.name] = ref[key[site.name]]
                ref[key[site.name]] += (token[site.name],)
        snaps: dict[int, Frame] = {}
        ck_fwd: dict[str, int] = {}

        def forward(items: Sequence[Any]) -> None:
            for item in items:
                if isinstance(item, Region):
                    enter(snaps, item)
                    forward(item.items)
                    leave(snaps, item)
                else:
                    if _draws(item):
                        ck_fwd[item.name] = ck[key[item.name]]
                        ck[key[item.name]] += (token[item.name],)
                    if item.save is not None:
                        save_exit[item.name] = State(tuple, ck)  # what a hook snapshots there

        save_exit: dict[str, State] = {}
        forward(program.items())
        for name, position in ck_fwd.items():
            if position != ref_fwd[name]:
                fail(("forward-mask", "output", "gradient"), moved_by.get(key[name], -1))
            if last_fwd.get(name) == position and token[name].split(".")[0] in RECORDS_THE_DRAW:
                fail(("fresh-randomness",), moved_by.get(key[name], -1))
        last_fwd = dict(ck_fwd)
        if interleave:
            for stream in keys:
                ref[stream] += ("interleaved",)
                ck[stream] += ("interleaved",)

        def recompute(region: Region, frame: Frame) -> None:
            if reached is not None and id(region) not in reached:
                return
            free = unsaved(region)
            saved_out = effects.saved_sites.get(id(region), {})
            before = State(tuple, ck)
            snap, stored_by = target(frame, region)
            for stream in keys:
                if stream not in free:
                    ck[stream] = snap[stream]
            order = region.sites()
            mine = {id(item) for item in region.items if not isinstance(item, Region)}
            last = max((n for n, site in enumerate(order) if id(site) in mine), default=-1)
            stop = order[last] if early and last >= 0 else None
            inner_snaps: dict[int, Frame] = {}
            shift: dict[str, int] = {}  # stream -> the entry whose saved op shifted it in this pass

            def rerun(items: Sequence[Any]) -> bool:
                for item in items:
                    if isinstance(item, Region):
                        enter(inner_snaps, item)
                        if rerun(item.items):
                            return True
                        leave(inner_snaps, item)
                        continue
                    if effects.save_skip and item.save is not None:
                        # a SAVE region's body is not rerun: no draw; its hooks put back what
                        # they snapshotted at its exit in forward
                        for stream in effects.save_skip[0] & set(keys):
                            ck[stream] = save_exit[item.name][stream]
                        if item is stop:
                            return True
                        continue
                    rerun_sites.add(item.name)
                    if _draws(item):
                        stream = key[item.name]
                        if item.name in saved_out:
                            shift.setdefault(stream, saved_out[item.name])
                        else:
                            if ck[stream] != ck_fwd[item.name]:
                                cause = free.get(stream, shift.get(stream, stored_by if stored_by >= 0
                                                                   else moved_by.get(stream, -1)))
                                # Non-reentrant, a draw the region's own saved tensors do not
                                # depend on (an inner region's site after the region's last own
                                # site: that inner region recomputes its own) changes no gradient.
                                used = reentrant or id(item) in mine or order.index(item) < last
                                fail(("recompute-mask", "gradient") if used else ("recompute-mask",), cause)
                                how = ("from where the stream is live: the checkpoint does not save it"
                                       if stream in free else "shifted: an earlier draw of its stream was "
                                       "saved by the policy, not rerun" if stream in shift else "at another position")
                                notes.setdefault(cause, f"{region.name}'s recompute redraws {item.name}@"
                                                        f"{code[item.name]} {how}")
                            ck[stream] += (token[item.name],)
                            if stream in free:
                                moved_by.setdefault(stream, free[stream])
                    if item is stop:
                        return True
                return False

            if not early or stop is not None:
                step["recomputing"] += 1
                rerun(region.items)
                step["recomputing"] -= 1
            for stream in keys:
                if stream in effects.not_restored and stream not in free and ck[stream] != before[stream]:
                    index = effects.not_restored[stream]
                    moved_by.setdefault(stream, index)
                    notes.setdefault(index, f"after {region.name}'s recompute {stream} stays where the "
                                            "recompute left it")
                elif stream not in free:
                    ck[stream] = before[stream]
            if reentrant:  # the inner regions' checkpoints, made by this recompute, recompute in its backward
                for inner in reversed([item for item in region.items if isinstance(item, Region)]):
                    recompute(inner, inner_snaps.get(id(inner), snaps[id(inner)]))

        rerun_sites: set[str] = set()
        if reentrant:
            for region in reversed(program.regions()):
                recompute(region, snaps[id(region)])
        else:
            for region in _unpack_order(program):
                recompute(region, snaps[id(region)])
        if reached is not None and any(name not in rerun_sites for name in ck_fwd if name in checkpointed):
            # A drawing site no recompute reruns: the recompute-mask oracle says "never recomputed"
            # (not of a site in a SAVE region, which it allows to be kept).
            fail(("recompute-mask",), effects.invisible_index)
        for stream in keys:
            if ck[stream] != ref[stream]:
                fail(("live-stream",), moved_by.get(stream, -1))
    for index, note in notes.items():
        effects.why.setdefault(index, []).append(note)
    return causes


def predict(models: Sequence[Model], case: Case, machine: Machine = LOCAL) -> Prediction:
    """What an impl with these behaviours (an entry's each, in file order) does in `case`."""
    effects = _effects(models, case, machine)
    if effects.raised:
        raised, index = min(effects.raised, key=lambda pair: (pair[0].phase, pair[0].order, pair[0].at, pair[1]))
        return Prediction("error", message=raised.message, causes=(index,), why=(raised.why,))
    causes = {oracle: set(found) for oracle, found in effects.mismatch.items()}
    for oracle, found in replay(case, effects, effects.reached).items():
        causes.setdefault(oracle, set()).update(found)
    if not causes:
        return Prediction("pass")
    deciding = sorted({i for found in causes.values() for i in found if i >= 0})
    why = [line for i in deciding for line in effects.why.get(i, [])]
    oracles = tuple(oracle for oracle in ("forward-mask", "recompute-mask", "gradient", "live-stream", "output",
                                          "fresh-randomness", "ambient") if oracle in causes)
    return Prediction("mismatch", oracles, causes=tuple(deciding), why=tuple(why))


def draws_shown(case: Case) -> str:
    """A short note of where the case draws, for explanations ('s0@t s1@d')."""
    code = case.streams()
    return " ".join(f"{site.name}@{code[site.name]}" for site in case.program.sites() if site.op not in NO_DRAW_OPS)

