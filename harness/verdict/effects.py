"""What each behaviour of `models` does in one case, before the draws are replayed: which
streams a region's checkpoint leaves unsaved or unrestored, which draws its policy keeps, which
errors it raises and when, which oracles it fails outright (`effects_of`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..model import ops
from ..model.cases import Case
from ..model.programs import SDPA_OPS, Dtype, Op, Passing, Region, Site, reading_groups
from .replay import backward_order, draws, enclosing_regions, recompute_points, stop_point, unpack_order

if TYPE_CHECKING:
    from .models import Machine, Model

STREAM_KINDS = ("tracker", "device", "cpu", "all")


ATTENTION = frozenset([*SDPA_OPS, Op.SDPA_AUTO])


# Ops whose RNG output the op itself changes in place right after drawing (bernoulli_ then div_),
# per device type: what selective checkpointing refuses to hand back from its cache.  On the CPU
# F.dropout and the math attention's dropout fill a bernoulli_ noise tensor and scale it in place.
IN_PLACE = {
    "cpu": frozenset([Op.BERNOULLI, Op.NORMAL, Op.UNIFORM, Op.EXPONENTIAL, Op.DROPOUT_INPLACE, Op.DROPOUT,
                      Op.SDPA_MATH]),
    "cuda": frozenset([Op.BERNOULLI, Op.NORMAL, Op.UNIFORM, Op.EXPONENTIAL, Op.DROPOUT_INPLACE]),
}


TRACKER_CODES = frozenset("tcmab")  # the stream codes a tracker holds (`programs.STREAMS`)


PINNED = {Op.SDPA_MATH: "math", Op.SDPA_EFFICIENT: "efficient", Op.SDPA_FLASH: "flash", Op.SDPA_CUDNN: "cudnn"}


# Error phases, in the order they happen (the earliest wins).
FORWARD, BACKWARD_START, RECOMPUTE = 0, 1, 2


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
    # `input-invisible`: whether a recompute whose output needs no grad raises (torch's does; a
    # checkpoint that backpropagates only the outputs that need grad goes on, silently)
    recompute_raises: bool = True
    nested_frames: bool = False  # `nested-frames`: an inner region's inputs sit in its enclosing frame
    # site -> the regions (ids) whose recompute reruns it: its innermost; with `nested_frames`, the
    # enclosing regions whose recompute reaches it as well
    reruns: dict[str, set[int]] = field(default_factory=dict)
    # `host-rewind` in a separate-graphs CUDA case: (per-capture device tensors, entry index)
    host_rewind: "tuple[bool, int] | None" = None
    # `rank-zero-rewind`: the streams seeded per rank that a recompute rewinds to rank 0's state, entry index
    rank_zero: "tuple[frozenset[str], int] | None" = None
    # `input-keyed-snapshots` (eager): region (id) -> the tensor it is called with, entry index
    input_keys: "tuple[dict[int, int], int] | None" = None
    raised: list[tuple[Raised, int]] = field(default_factory=list)
    # `context-not-replayed` without an error: (region id, oracles, entry index, why), kept where
    # backward recomputes the region
    unreplayed: list[tuple[int, tuple[str, ...], int, str]] = field(default_factory=list)
    mismatch: dict[str, set[int]] = field(default_factory=dict)  # oracle -> entry indexes
    why: dict[int, list[str]] = field(default_factory=dict)

    def fails(self, oracle: str, index: int, why: str = "") -> None:
        self.mismatch.setdefault(oracle, set()).add(index)
        if why:
            self.why.setdefault(index, []).append(why)


def _kinds(streams: Iterable[str], device: str) -> frozenset[str]:
    out = set()
    for kind in streams:
        if kind == "all":
            out |= {"t", "c", "m", "a", "cpu", "d"}
        elif kind == "tracker":
            out |= {"t", "c", "m", "a"}
        elif kind == "device":
            out.add("cpu" if device == "cpu" else "d")
        else:
            out.add("cpu")
    return frozenset(out)


def _pinned(program: Any) -> dict[str, Op]:
    """Site name -> the attention backend (an op) the innermost sdpa_kernel region around it pins."""
    out: dict[str, Op] = {}
    for region in program.all_regions():  # outer before inner: the inner context wins
        if region.passing is Passing.SDPA_KERNEL and region.backend is not None:
            out.update({site.name: region.backend for site in region.sites()})
    return out


def _innermost(program: Any, passing: "Passing | None" = None) -> dict[str, Region]:
    """Site name -> the innermost region around it (entered with `passing`, where given)."""
    out: dict[str, Region] = {}
    for region in program.all_regions():  # outer before inner: the inner one wins
        if passing is None or region.passing is passing:
            out.update({site.name: region for site in region.sites()})
    return out


def _autocast_sites(program: Any) -> frozenset[str]:
    """The sites that run inside an autocast region (at any depth)."""
    return frozenset(_innermost(program, Passing.AUTOCAST))


def _run_dtype(site: Site, under_autocast: frozenset[str]) -> Dtype:
    """The dtype an attention site's kernel runs in: bfloat16 inside an autocast region (autocast
    casts attention to its dtype, the workload's bfloat16), its own elsewhere; the attention
    backend torch picks depends on it (on the H200, float32 attention of the odd shape runs on
    math, bfloat16 on flash)."""
    return Dtype.BF16 if site.op in ATTENTION and site.name in under_autocast else site.dtype


def _own_op(site: Site, pinned: dict[str, Op]) -> Op:
    """The attention op a site runs in its forward: the pinned backend under sdpa_kernel."""
    if site.op in ATTENTION and not site.own_backend and site.name in pinned:
        return pinned[site.name]
    return site.op


def effects_of(models: Sequence[Model], case: Case, machine: Machine) -> Effects:
    device, reentrant = case.device.value, case.mode.value == "reentrant"
    program = case.program
    effects = Effects()
    # traits read before the loop: they order the recomputes and say what a recompute reruns
    effects.nested_frames = any(model.behaviour == "nested-frames" for model in models)
    effects.early_stop = any(model.behaviour == "early-stop" for model in models)
    effects.save_skip = next(((_kinds(model.get("restored", ()), device), index) for index, model in enumerate(models)
                              if model.behaviour == "skips-save-regions"), None)
    ranked = backward_order(program.items()) if reentrant else unpack_order(program, effects.nested_frames)
    # non-reentrant: the regions that recompute on their own (ranked by `order` below)
    recomputing = set() if reentrant else {id(r) for r in ranked}
    ranked += [r for r in program.all_regions() if r not in ranked]  # no own site: never on their own
    order = {id(r): n for n, r in enumerate(ranked)}
    for region in program.all_regions():  # outer before inner: a site's innermost region recomputes it
        for site in region.sites():
            effects.reruns[site.name] = {id(region)}
    if effects.nested_frames and not reentrant:
        # an enclosing region's recompute reruns its inner regions' bodies too, up to the point its
        # own recompute stops (torch's stops early: at its last own site or the entry of an inner
        # region whose input its frame holds, `stop_point`; seen on the CPU, torch 2.13: in
        # (sdpa_kernel(sdpa_auto+sdpa_math)) the inner recompute's 'not found in storage' comes
        # first, in ((sdpa_kernel(sdpa_auto+sdpa_math))+native_dropout) the outer one's 'mutated')
        points = recompute_points(program, True)
        for region in program.all_regions():
            stop = stop_point(region, True) if effects.early_stop else float("inf")
            for site in region.sites():
                if id(region) in points and stop is not None and site.index < stop:
                    effects.reruns[site.name].add(id(region))
    for site_name, regions in effects.reruns.items():  # an error a site's op raises comes in the first
        order[site_name] = min(order[rid] for rid in regions)  # recompute that reruns the site
    for index, model in enumerate(models):
        name = model.behaviour
        if name == "unsaved-streams":
            passing = model.get("passing")
            effects.unsaved.append((_kinds(model.get("streams"), device),
                                    frozenset(Passing(p) for p in passing) if passing else None, index))
        elif name == "saved-rng-ops":
            message = model.get("mutated_message")
            pinned = _pinned(program)  # the same for every region of the case
            for region in program.all_regions():
                chosen = _saved_sites(region, model, case, machine, pinned)
                for site in chosen:
                    effects.saved_sites.setdefault(id(region), {}).setdefault(site.name, index)
                hit = next((site for site in chosen if site.op in IN_PLACE.get(device, ())), None)
                if message and hit:
                    effects.raised.append((Raised(RECOMPUTE, order[hit.name], message,
                                                  f"{hit.name} ({hit.op.value}) is saved by the policy of "
                                                  f"{region.name} and changed in place after", hit.index), index))
        elif name == "refuses-input" and model.get("recompute", False):
            passings = {Passing(p) for p in model.get("passing")}
            for region in program.all_regions():  # every such region recomputed on its own raises there
                if region.passing in passings and any(not isinstance(item, Region) for item in region.items):
                    effects.raised.append((Raised(RECOMPUTE, order[id(region)], model.get("message"),
                                                  f"{region.name} is entered {region.passing.value}: its "
                                                  "recompute is called with other arguments"), index))
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
            effects.recompute_raises = effects.recompute_raises and model.get("recompute_raises", True)
        elif name == "context-not-replayed":
            # whether the recompute runs under the forward's autocast: unless this impl's models
            # say it does not replay autocast either
            replays_autocast = not any(m.behaviour == "context-not-replayed" and m.get("context") == ("autocast",)
                                       for m in models)
            policies = [m for m in models if m.behaviour == "saved-rng-ops"]
            _context_effects(case, machine, model, index, order, effects, reentrant, replays_autocast, policies,
                             recomputing)
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
            tracked = [site for site in program.sites() if draws(site) and code[site.name] in TRACKER_CODES]
            if tracked or case.layout.value == "shared":
                why = (f"{tracked[0].name} draws from {code[tracked[0].name]}, but fork() switches to no stream"
                       if tracked else "the shared layout's alias probe forks both names")
                effects.raised.append((Raised(FORWARD, -1, model.get("message"), why), index))
        elif name == "leaks-ambient":
            undone = {Passing(p) for p in model.get("undone_by", ())}
            enclosing = enclosing_regions(program.items())
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
        elif name in ("nested-frames", "early-stop", "skips-save-regions"):
            pass  # traits, read before the loop
        elif name == "grouped-input-gradient":
            passing = model.get("passing")
            hit = _grouped_read(program, frozenset(Passing(p) for p in passing) if passing else None,
                                model.get("nested", False))
            if hit is not None:
                effects.fails("gradient", index, f"{hit.name} reads its input more than once and a later item reads "
                                                 "it too: its input gradient is summed in another order (rounding, "
                                                 "not a draw)")
        elif name == "input-keyed-snapshots":
            if case.capture.value == "eager" and effects.input_keys is None:
                effects.input_keys = (_input_tensors(program), index)
        elif name == "fresh-recompute":
            # every site, in a region or not: the budget covers the whole graph (a program without
            # a region has nothing to annotate, nothing to recompute)
            drawing = [site for site in program.sites() if draws(site)] if program.all_regions() else []
            redrawn = machine.backward_rng() if model.get("observed", False) else None
            # inductor's random ops read a seed: with the forward's seeds (no inductor_seeds of its
            # own) a backward graph replays the forward's numbers; fresh are new seeds or aten RNG
            redrawn = [op for op in redrawn or [] if not any(word in op for word in SEED_READERS)]
            if model.get("observed", False) and not redrawn:
                drawing = []  # nobody looked, or the backward graph draws nothing afresh: no claim
            if drawing:
                why = (f"{drawing[0].name} ({drawing[0].op.value}) is recomputed in the backward graph with fresh "
                       "draws: the stream ends ahead" + (f" (it holds {', '.join(redrawn)})" if redrawn else ""))
                oracles = ["gradient", "live-stream", "output"]
                if ops.has_pattern(program):  # what a compiled run compares of dropout masks
                    oracles += ["recompute-mask", "forward-mask"]
                for oracle in oracles:
                    effects.fails(oracle, index, why if oracle == "gradient" else "")
        elif name == "rank-zero-rewind":
            effects.rank_zero = effects.rank_zero or (machine.per_rank_streams(model.get("axes")), index)
        elif name == "emptied-argument" and not reentrant:
            for reader, owner in _emptied_readers(program):
                if id(reader) not in recomputing:
                    continue  # never recomputed on its own
                if id(owner) in recomputing and order[id(owner)] < order[id(reader)]:
                    continue  # the owner's recompute refilled its argument first
                why = (f"{reader.name} reads {owner.name}'s argument as it is, which the checkpoint emptied after "
                       f"{owner.name}'s forward: {reader.name}'s recompute runs on an empty tensor")
                event = _scalar_event(reader.items)
                if event is not None:
                    kind, where = event
                    said = model.get("scalar_message") if kind == "op" else model.get("message")
                    if said:
                        how = (f"{where.name} ({where.op.value}) cannot run on a scalar" if kind == "op" else
                               f"{where.name}'s checkpoint returns what is unlike its scalar input (harness check)"
                               if where.passing is not Passing.AUTOCAST else
                               f"{where.name}'s matmul cannot take a scalar")
                        effects.raised.append((Raised(RECOMPUTE, order[id(reader)], said, f"{why}: {how}"), index))
                        continue
                if any(draws(site) for site in reader.sites()):
                    effects.fails("recompute-mask", index, why)
                effects.fails("gradient", index, why)
        elif name == "host-rewind":
            if case.capture.value == "separate" and device == "cuda" and effects.host_rewind is None:
                effects.host_rewind = (bool(model.get("per_capture", False)), index)
    if effects.invisible:
        _invisible_effects(program, effects, order)
        if effects.reached is not None:
            # a region backward never recomputes raises nothing in its recompute
            ranks = {order[region_id] for region_id in effects.reached}
            effects.raised = [(raised, index) for raised, index in effects.raised
                              if raised.phase != RECOMPUTE or raised.order in ranks]
    for region_id, oracles, index, why in effects.unreplayed:
        if effects.reached is None or region_id in effects.reached:
            for oracle in oracles:
                effects.fails(oracle, index, why if oracle == "gradient" else "")
    return effects


def _grouped_read(program: Any, passings: "frozenset[Passing] | None" = None, nested: bool = False
                  ) -> "Region | None":
    """The first top-level region (with `nested`, at any depth) whose input a later parallel item
    reads too and which reads it at least twice itself (the items of its first group, through the
    first groups of inner regions that read the same tensor): `grouped-input-gradient`; only
    regions entered one of `passings` (None: any but closure).  The reference adds the gradient
    terms of that tensor one by one, the later reader's first; the checkpoint hands back the
    region's own terms already summed."""
    def reads(region: Region) -> int:
        if region.passing is Passing.AUTOCAST:
            return 1  # its body starts with a matmul of its input: the rest reads that (H100 fuzz, megatron)
        first = next(iter(reading_groups(tuple(region.items))), [])
        return sum(2 if isinstance(item, Region) and item.passing is Passing.TWICE  # two arguments
                   else max(1, reads(item)) if isinstance(item, Region) and item.passing is not Passing.CLOSURE
                   else 1 for item in first)

    def readers(item: Any) -> list[Any]:
        """`item`, or for a closure region (it hands its input on as is) the items of its first
        group, and so on down."""
        if isinstance(item, Region) and item.passing is Passing.CLOSURE:
            return [found for inner in next(iter(reading_groups(tuple(item.items))), []) for found in readers(inner)]
        return [item]

    def search(items: Sequence[Any]) -> "Region | None":
        for group in reading_groups(tuple(items)):
            for item in (found for early in group[:-1] for found in (readers(early) if nested else [early])):
                if (isinstance(item, Region) and item.passing is not Passing.CLOSURE
                        and (passings is None or item.passing in passings) and reads(item) > 1):
                    return item
        if nested:
            for item in items:
                found = search(item.items) if isinstance(item, Region) else None
                if found is not None:
                    return found
        return None

    return search(program.items())


def _input_tensors(program: Any) -> dict[int, int]:
    """Region (id) -> the tensor (a number per tensor object) the workload calls its checkpoint
    with: the tensor its reading group reads (`reading_groups`); a region's body reads its own
    input, except where it computes a new one first (autocast's matmul, the mean of twice's two
    arguments).  Closure regions pass no tensor and are absent."""
    out: dict[int, int] = {}
    fresh = iter(range(1, 1 << 30))

    def step(item: Any, tensor: int) -> int:
        if isinstance(item, Region):
            if item.passing is not Passing.CLOSURE:
                out[id(item)] = tensor
            body = next(fresh) if item.passing in (Passing.AUTOCAST, Passing.TWICE) else tensor
            _read_along(item.items, body, step, lambda _: next(fresh))
        return next(fresh)  # a site's output; a region's (its last item's, cast back: a new tensor)

    _read_along(program.items(), 0, step, lambda _: next(fresh))  # a parallel group's output: the sum
    return out


# The passings whose region takes its input as a tensor argument its body reads as is (autocast and
# twice compute a new tensor first; a list or dict is no tensor; a closure passes nothing).
ARGUMENT_READ = frozenset({Passing.POSITIONAL, Passing.KEYWORD, Passing.SDPA_KERNEL})
# The passings whose region's body reads the very tensor it was handed (by closure, or inside a
# list or dict the checkpoint keeps as it is): an emptied argument reaches it as it is.
HANDED_ON = frozenset({Passing.CLOSURE, Passing.LIST, Passing.DICT})


def _cpu_math(device: str, site: Site) -> bool:
    """The CPU's math attention: recomputed in another dtype it raises nothing (it redraws)."""
    return device == "cpu" and site.op is Op.SDPA_MATH


def _outside_rank(region: Region, site: "Site | None", order: dict[Any, int], effects: Effects) -> int:
    """The rank of the first recompute that runs `site` (None: `region`'s own code) outside the
    context `region` is entered under: `region`'s own recompute or that of a region inside it that
    reruns the site.  An enclosing region's recompute reruns `region` under the context, which its
    own body enters."""
    if site is None:
        return order[id(region)]
    inside = {id(region), *(id(inner) for inner in _regions_inside(region))}
    return min(order[rid] for rid in effects.reruns[site.name] if rid in inside)


def _regions_inside(region: Region) -> list[Region]:
    """Every region nested in `region`, at any depth."""
    out: list[Region] = []
    for item in region.items:
        if isinstance(item, Region):
            out += [item, *_regions_inside(item)]
    return out


SEED_READERS = ("inductor_random", "inductor_randint", "inductor_lookup_seed")  # ops that draw from a given seed
NEEDS_DIMENSIONS = frozenset([Op.MULTINOMIAL, *ATTENTION])  # ops that raise on a 0-dimensional input


def _scalar_event(items: Sequence[Any]) -> "tuple[str, Any] | None":
    """What first fails when `items` get a scalar (`emptied-argument`): only the items that read
    it (the first reading group; a site multiplies it by its weight, and what it hands on has the
    weight's shape again), in the order they run: ``("op", site)`` for a site whose op needs
    dimensions, ``("call", region)`` for a region (not a closure) whose checkpoint call returns
    what is unlike its scalar input, or, autocast, starts with a matmul."""
    for item in next(iter(reading_groups(tuple(items))), []):
        if isinstance(item, Region):
            if item.passing is Passing.AUTOCAST:
                return "call", item  # its matmul comes first
            inner = _scalar_event(item.items)
            if inner is not None:
                return inner
            if item.passing is not Passing.CLOSURE:
                return "call", item
        elif item.op in NEEDS_DIMENSIONS:
            return "op", item
    return None


def _emptied_readers(program: Any) -> list[tuple[Region, Region]]:
    """(reader, the region whose argument it reads) for every region entered by closure, list or
    dict (`HANDED_ON`) that reads an enclosing region's tensor argument as is
    (`emptied-argument`), however many such regions lie between."""
    out: list[tuple[Region, Region]] = []
    owners: dict[int, Region] = {}  # tensor number -> the region it is the argument of
    fresh = iter(range(1, 1 << 30))

    def step(item: Any, tensor: int) -> int:
        if isinstance(item, Region):
            body = tensor
            if item.passing in HANDED_ON:
                if tensor in owners:
                    out.append((item, owners[tensor]))
            else:
                body = next(fresh)  # the argument the checkpoint gets: a tensor of its own
                if item.passing in ARGUMENT_READ:
                    owners[body] = item
            _read_along(item.items, body, step, lambda _: next(fresh))
        return next(fresh)

    _read_along(program.items(), 0, step, lambda _: next(fresh))
    return out


def _read_along(items: Sequence[Any], value: Any, step: Any, joined: Any = None) -> Any:
    """Walk `items` as the workload reads them (`reading_groups`): each item of a group gets the
    group's input `value` from ``step(item, value)``, the group's output is its first item's
    (``joined(that)`` where parallel items add theirs), and the next group reads it."""
    for first, *parallel in reading_groups(tuple(items)):
        base = value
        value = step(first, base)
        for item in parallel:
            step(item, base)
        if parallel and joined is not None:
            value = joined(value)
    return value


def _seeded(site: Site, pinned: dict[str, Op], case: Case, machine: Machine) -> bool:
    """Whether the op a site runs is one torch tags ``nondeterministic_seeded`` (what a selective
    policy counts as an RNG op): every drawing op, and attention without dropout where it runs
    on a fused kernel (flash, efficient, cuDNN take a dropout argument even at p = 0)."""
    if draws(site):
        return True
    if site.op is not Op.SDPA_AUTO:
        return False
    own = _own_op(site, pinned)
    chosen = (PINNED[own] if own in PINNED else
              machine.backend(case.device.value, site, case.shape, _run_dtype(site, _autocast_sites(case.program))))
    return chosen not in (None, "math")


def _saved_sites(region: Region, model: Model, case: Case, machine: Machine, pinned: dict[str, Op]) -> list[Site]:
    """The drawing sites of `region` (its inner regions' included: they run inside its forward)
    whose output its selective policy saves, so that its recompute does not redraw them."""
    sites = region.sites()
    if model.get("every"):
        return [site for site in sites if draws(site)]
    if model.get("first"):
        first = next((site for site in sites if _seeded(site, pinned, case, machine)), None)
        return [first] if first is not None and draws(first) else []
    saved = {Op(o) for o in model.get("ops", ())}
    return [site for site in sites if draws(site) and _own_op(site, pinned) in saved]


def _entering_dtypes(program: Any) -> dict[int, Dtype]:
    """Region (id) -> the dtype of the tensor it is called with: a site hands on its own dtype
    (it casts its input and multiplies by a weight of its dtype), a region the dtype it was called
    with, a parallel item adds its output to the first item's."""
    out: dict[int, Dtype] = {}

    def step(item: Any, dtype: Dtype) -> Dtype:
        if isinstance(item, Region):
            out[id(item)] = dtype
            _read_along(item.items, dtype, step)
            return dtype
        return item.dtype

    _read_along(program.items(), program.dtype, step)
    return out


def _policy_caches(site: Site, chosen: str, case: Case, machine: Machine, policies: Sequence[Model]) -> bool:
    """Whether a selective policy caches the op an attention site's recompute runs (on `chosen`,
    another backend than its forward's): it then looks the op up in its cache and finds nothing.
    Every RNG op: any fused backend (math decomposes into ops that are not attention); a list:
    that backend's op; the first RNG op of each region: where the site is its innermost region's
    first."""
    fused = chosen != "math"
    op = next((o for o, name in PINNED.items() if name == chosen), None)
    inner = _innermost(case.program).get(site.name)
    for policy in policies:
        if policy.get("every") and fused:
            return True
        if policy.get("ops") and op is not None and op in {Op(o) for o in policy.get("ops")}:
            return True
        if policy.get("first") and fused and inner is not None:
            pinned = _pinned(case.program)
            first = next((s for s in inner.sites()
                          if (s.name == site.name) or _seeded(s, pinned, case, machine)), None)
            if first is not None and first.name == site.name:
                return True
    return False


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
        if not body[id(region)] and effects.recompute_raises:
            # raised once the recompute is done (backward through its output): after anything its
            # body raises (an autocast region's matmul on two dtypes, seen on an H100: megatron,
            # torch 2.11, (native_dropout.bf16+autocast(list(native_dropout))))
            after = max((site.index for site in region.sites()), default=-1) + 1
            effects.raised.append((Raised(RECOMPUTE, order[id(region)], message,
                                          f"{region.name}'s recompute output does not require grad", after), index))
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
                     effects: Effects, reentrant: bool, replays_autocast: bool = True,
                     policies: Sequence[Model] = (), recomputing: "set[int] | frozenset[int]" = frozenset()
                     ) -> None:
    """What a recompute outside the region's context changes: under ``sdpa_kernel``, an attention
    site on another backend (this machine's own choice); under ``autocast``, the region's first
    matmul in the program's dtype instead of bfloat16 (nothing changes for a bfloat16 program).
    Non-reentrant with a ``message``, the recompute raises; otherwise other gradients (and another
    mask where the changed site draws).  A site the impl keeps (a SAVE region, where the impl has
    ``skips-save-regions``: ``effects.save_skip``) is not recomputed and changes nothing."""
    device, message = case.device.value, model.get("message")
    changed: list[tuple[Region, str, bool, "Site | None"]] = []  # region, why, whether a draw changes, site
    chosen_of: dict[str, str] = {}  # site -> the backend its recompute runs on
    pinned_name: dict[str, str] = {}  # site -> the backend its forward ran on (under sdpa_kernel)
    raises_from = dict(model.get("raises_from", ()))  # forward backend -> what the recompute raises
    always: set[int] = set()  # regions whose recompute raises in either mode
    if model.get("context") == ("autocast",):
        entering = _entering_dtypes(case.program)
        for region in case.program.all_regions():
            if region.passing is not Passing.AUTOCAST:
                continue
            if entering[id(region)] is not case.program.dtype:
                # its input is not in the matrix's dtype: autocast cast both, the recompute
                # outside it multiplies a tensor of one dtype by a matrix of another
                always.add(id(region))
                changed.append((region, f"{region.name}'s input is {entering[id(region)].value}, its matrix "
                                        f"{case.program.dtype.value}: autocast cast both in forward; the recompute, "
                                        "outside it, multiplies them as they are", False, None))
            elif case.program.dtype.value != "bf16":
                changed.append((region, f"{region.name}'s matmul ran in bfloat16 under autocast in forward; the "
                                        f"recompute, outside it, runs it in {case.program.dtype.value}", False, None))
        # attention of another dtype: autocast ran it in bfloat16, the recompute in its own dtype
        # (each site under its innermost autocast region)
        innermost = _innermost(case.program, Passing.AUTOCAST)
        attention = [(region, f"{site.name} ({site.op.value}) ran in bfloat16 under autocast in forward; the "
                              f"recompute, outside it, runs it in {site.dtype.value}", True, site)
                     for region in case.program.all_regions() if region.passing is Passing.AUTOCAST
                     for site in region.sites() if site.op in ATTENTION and site.dtype is not Dtype.BF16
                     and innermost[site.name] is region]
        # every one the CPU's math kernel runs redraws; of the others the first raises
        changed += [found for found in attention if _cpu_math(device, found[3])]
        changed += [found for found in attention if not _cpu_math(device, found[3])][:1]
    else:
        pinned_of = _pinned(case.program)
        under_autocast = _autocast_sites(case.program) if replays_autocast else frozenset()
        for region in case.program.all_regions():
            if region.passing is not Passing.SDPA_KERNEL:
                continue
            for site in region.sites():
                if site.op not in ATTENTION or site.own_backend or site.name not in pinned_of:
                    continue
                if effects.save_skip is not None and site.save is not None:
                    continue  # kept, not recomputed: it never runs outside the context
                pinned = PINNED.get(pinned_of[site.name])
                dtype = _run_dtype(site, under_autocast)
                chosen = machine.backend(device, site, case.shape, dtype)
                if chosen is None or pinned is None or chosen == pinned:
                    continue
                chosen_of[site.name] = chosen
                pinned_name[site.name] = pinned
                changed.append((region, f"{site.name} ran on {pinned} under sdpa_kernel in forward; the recompute, "
                                        f"outside it, runs on {chosen} (this machine's choice for {dtype.value}"
                                        f"{' with dropout' if draws(site) else ' without dropout'})", draws(site),
                                site))
    autocast = model.get("context") == ("autocast",)
    attention_message = model.get("attention_message") if autocast and not reentrant else None
    mixed_message = model.get("mixed_message") if autocast else None
    # the CPU's math attention recomputed in another dtype raises nothing: it draws its dropout in
    # that dtype (another mask) and its backward takes the gradient as it comes
    raises_in = [(region, site) for region, _, _, site in changed if site is not None
                 and not _cpu_math(device, site)]
    # regions whose attention's backward (it runs before the matmul's) meets the other dtype first
    attention_first = {id(region) for region, site in raises_in} if attention_message else set()
    innermost = _innermost(case.program)
    for region, why, drawn, site in changed:
        # where the entry says what a recompute raises per forward backend, a backend it does not
        # name raises nothing there (unless `message` is given for the rest)
        site_message = (raises_from.get(pinned_name[site.name], message)
                        if site is not None and site.name in pinned_name else message)
        if attention_message and site is not None and (region, site) in raises_in:
            effects.raised.append((Raised(RECOMPUTE, _outside_rank(region, site, order, effects), attention_message,
                                          why, site.index), index))
            continue
        if id(region) in attention_first:
            continue
        if mixed_message and site is None and id(region) in always:
            effects.raised.append((Raised(RECOMPUTE, order[id(region)], mixed_message, why), index))
            continue
        # the message is the matmul's dtype error; attention in another dtype raises nothing
        if site_message and (not reentrant or id(region) in always) and not (autocast and site is not None):
            rank = _outside_rank(region, site, order, effects)
            inside = [order[id(inner)] for inner in _regions_inside(region) if id(inner) in recomputing]
            own = any(not isinstance(item, Region) for item in region.items)
            if autocast and site is None and not reentrant and id(region) not in always and (inside or own):
                # the matmul starts the region: its backward, which raises, comes after the region's
                # own recompute (an error there comes first) and those of the regions inside it
                # (backward reaches their tensors first); a region entered in another dtype than
                # its matrix's raises in the recompute itself
                rank = max([*inside, *([rank] if own else [])]) + 0.5
            said = site_message
            if site is not None and policies and model.get("recomputed_message") and not _policy_caches(
                    site, chosen_of[site.name], case, machine, policies):
                said = model.get("recomputed_message")
                # torch's recompute check compares once a frame's recompute is done: an error an
                # op raises during any recompute (a cached tensor found mutated) comes first
                rank += len(order)
            effects.raised.append((Raised(RECOMPUTE, rank, said, why, site.index if site else -1), index))
        else:  # (only where backward recomputes the site's own region: `_invisible_effects` may say it
            # does not; a site in a region nested in the sdpa_kernel one draws its recompute mask in
            # its own region's recompute, which a keyword region inside it never gets, reentrant)
            rerun = innermost[site.name] if site is not None else region
            effects.unreplayed.append((id(rerun), ("gradient", "recompute-mask") if drawn else ("gradient",),
                                       index, why))
