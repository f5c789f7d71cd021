"""The model under test: a case's region program (`harness.model.programs`), built and run.

Each site runs its op (`harness.model.ops`) on the activation, reports the RNG output through the
recording callback, then multiplies by its own weight.  What each region call returns (its output,
as the caller sees it) is reported the same way under the region's name, and the loss under
``loss``.  Which stream a site draws from follows the case's layout; how a region receives its
input (and the context it is entered under) follows the program's passing.  The same `Workload`
runs the reference (no checkpoint) and the checkpointed run, so the two differ only in the
checkpoint function passed in.

With a `watch` callback (the reference run), every eager site draw also reports which streams it
advanced, so the harness can check that the reference drew from the streams the layout says
before it trusts it.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..check.records import LOSS
from ..checkpoint.generators import default_generator
from ..model import ops
from ..model.cases import Case, Interleave, Layout, Passing
from ..model.programs import TORCH_DTYPES, Dtype, Item, Region, Site, reading_groups
from ..rank_context import stream_seed
from .streams import state_value

GLOBAL_SEED = 1234  # torch.manual_seed for CPU and every CUDA device
TRACKED_STREAM = "model-parallel-rng"  # Megatron-core's and TransformerEngine's name for it
# The other streams Megatron-core keeps (data-, expert-parallel) or adds in open work (context-,
# model-and-context-parallel), live in the tracked and mixed layouts beside the one the sites draw
# from: a checkpoint must leave every one of them where the reference does (interleaved draws
# move them all between forward and backward).
OTHER_TRACKED_STREAMS = ("data-parallel-rng", "expert-parallel-rng", "context-parallel-rng",
                         "model-and-context-parallel-rng")
SHARED_STREAMS = ("shared-a", "shared-b")  # shared-b is an alias of shared-a
STREAM_SEEDS = {TRACKED_STREAM: 2718, SHARED_STREAMS[0]: 3141,
                **{name: 2719 + n for n, name in enumerate(OTHER_TRACKED_STREAMS)}}
INTERLEAVE_NUMEL = 1000  # per live stream, between forward and backward
AUTOCAST_DTYPE = torch.bfloat16  # the one autocast dtype CPU and CUDA both have
KEYWORD = "inp"  # the keyword a region takes its input by, in the keyword passing

# checkpoint(fn, args, kwargs, like) -> fn(*args, **kwargs), checkpointed; `like` is the tensor the
# region's output must resemble (its input, wherever that input travels).
CheckpointFn = Callable[[Callable[..., Any], tuple, dict, torch.Tensor], torch.Tensor]
Record = Callable[[str, torch.Tensor], None]
Watch = Callable[[str, bool, bool], None]  # site, advanced the default generator, advanced its stream
Point = Callable[[str], None]  # the run reached a point where its ambient state is read ("after r0 forward")


# A `programs.STREAMS` code -> the tracker stream it names (None: the default generator).
STREAM_NAMES = {"d": None, "t": TRACKED_STREAM, "c": "context-parallel-rng", "m": "model-and-context-parallel-rng",
                "a": SHARED_STREAMS[0], "b": SHARED_STREAMS[1]}


def case_streams(case: Case) -> dict[str, str | None]:
    """Site name -> the tracker stream it draws from in `case` (None: the default generator):
    the site's own stream where its program names one, else its layout's."""
    return {name: STREAM_NAMES[code] for name, code in case.streams().items()}


def seed_all() -> None:
    """`torch.manual_seed(GLOBAL_SEED)` for the CPU and every initialised CUDA device, directly.

    (torch.manual_seed on a machine where CUDA is not initialised queues a lazy CUDA call and
    records its stack, which costs more than the rest of a small case.)
    """
    from ..checkpoint.generators import device_default_generators

    for gen in device_default_generators():
        gen.manual_seed(GLOBAL_SEED)


def make_tracker_streams(tracker: Any, layout: Layout) -> None:
    """Add the streams a layout uses to a fresh tracker (deterministic seeds, per TP rank where
    Megatron's are: `rank_context.stream_seed`): the tracked stream,
    in the tracked and mixed layouts Megatron's other stream names too (`OTHER_TRACKED_STREAMS`),
    and in the shared layout (the only one whose sites may draw from them) the shared pair."""
    if tracker is None:
        return
    tracker.add(TRACKED_STREAM, stream_seed(TRACKED_STREAM, STREAM_SEEDS[TRACKED_STREAM]))
    if layout in (Layout.TRACKED, Layout.MIXED):
        for name in OTHER_TRACKED_STREAMS:
            tracker.add(name, stream_seed(name, STREAM_SEEDS[name]))
    if layout is Layout.SHARED:
        tracker.add(SHARED_STREAMS[0], stream_seed(SHARED_STREAMS[0], STREAM_SEEDS[SHARED_STREAMS[0]]))
        tracker.add_alias(SHARED_STREAMS[1], SHARED_STREAMS[0])


@dataclass
class Tensors:
    """Input and parameters of one case, made from a private generator (no global RNG used):
    ``input`` (in the program's dtype), ``weight.sN`` per site (in the site's dtype), ``matrix.rN``
    per region that starts with a matmul (the autocast passing), and the loss weight."""

    x: torch.Tensor
    weights: dict[str, torch.Tensor]
    loss_weight: torch.Tensor

    @classmethod
    def make(cls, case: Case, device: torch.device) -> "Tensors":
        gen = torch.Generator().manual_seed(0)
        program = case.program
        shape = program.shape_dims

        def draw(size: tuple[int, int] = shape, scale: float = 1.0, dtype: Dtype = program.dtype) -> torch.Tensor:
            value = (torch.rand(size, generator=gen) + 0.5) * scale
            return value.to(device=device, dtype=torch_dtype(dtype))

        x = draw()
        weights = {f"weight.{site.name}": draw(dtype=site.dtype) for site in program.sites()}
        weights.update({f"matrix.{r.name}": draw((shape[1], shape[1]), 1.0 / shape[1])
                        for r in program.all_regions() if r.passing is Passing.AUTOCAST})
        return cls(x, weights, draw())

    def fresh_leaves(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """New leaf tensors (requires_grad) with the same values, for one run."""
        x = self.x.clone().requires_grad_(True)
        weights = {k: v.clone().requires_grad_(True) for k, v in self.weights.items()}
        return x, weights


@dataclass(frozen=True)
class RunNames:
    """What the oracles read of a case's program besides the runs' records (`Workload`'s names,
    without a workload): the checkpointed sites, the drawing sites, the outputs kept, and each
    site's tracker stream."""

    checkpointed: list[str]
    drawing: list[str]
    outputs: list[str]
    site_streams: dict[str, str | None]

    @classmethod
    def of(cls, case: Case) -> "RunNames":
        program = case.program
        return cls([site.name for site in program.checkpointed_sites()],
                   [site.name for site in program.sites() if ops.REGISTRY[site.op].draws],
                   [*(region.name for region in program.all_regions()), LOSS], dict(case_streams(case)))


def torch_dtype(dtype: Dtype) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES[dtype])


def alias_problem(tracker: Any, device: torch.device) -> str:
    """'' when a draw through the shared layout's alias advances the alias and the stream it
    aliases (a real alias is one state object); else what went wrong: the fork did not switch to
    the alias at all, or the alias is a copy.  Every state the probe touches is put back."""
    alias, name = SHARED_STREAMS[1], SHARED_STREAMS[0]
    default = default_generator(device)
    before, default_before = tracker.get_states(), default.get_state()
    try:
        with tracker.fork(alias):
            torch.rand(1, device=device)
        after = tracker.get_states()
    finally:
        tracker.set_states(before)
        default.set_state(default_before)
    moved = {n: not torch.equal(state_value(before[n]), state_value(after[n])) for n in (alias, name)}
    if not moved[alias]:
        return f"tracker fork({alias!r}) did not switch streams: a draw through it left {alias!r} where it was"
    if not moved[name]:
        return (f"tracker alias {alias!r} does not share the state of {name!r}: a draw through it left "
                f"{name!r} where it was (add_alias made a copy)")
    return ""


def _capturing() -> bool:
    # Not checkpoint.rng._capturing: tests patch that one to fake a capture for the checkpoint,
    # while the watch must see whether a draw really happens inside a graph capture.
    # is_initialized, not is_available: nothing captures before CUDA is initialised, and it is
    # the cheaper question (is_available reads the environment), asked at every drawing site.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _entered(region_fn: Callable[[torch.Tensor], torch.Tensor], passing: Passing,
             h: torch.Tensor) -> tuple[Callable[..., torch.Tensor], tuple, dict]:
    """The region as a function of its input the way `passing` delivers it, with the arguments
    to call it with: ``fn(h)``, ``fn(inp=h)``, ``fn()`` closing over h, ``fn([h])``, ``fn({'h': h})``."""
    if passing is Passing.KEYWORD:
        return (lambda *, inp: region_fn(inp)), (), {KEYWORD: h}
    if passing is Passing.CLOSURE:
        return (lambda: region_fn(h)), (), {}
    if passing is Passing.LIST:
        return (lambda hs: region_fn(hs[0])), ([h],), {}
    if passing is Passing.DICT:
        return (lambda d: region_fn(d["h"])), ({"h": h},), {}
    if passing is Passing.TWICE:  # one tensor as two arguments: a checkpoint must not mix them up
        return (lambda a, b: region_fn((a + b) * 0.5)), (h, h), {}
    return region_fn, (h,), {}


class Workload:
    """Builds the forward of one case around a checkpoint function (or none, for the reference)."""

    def __init__(
        self,
        case: Case,
        device: torch.device,
        tracker: Any,
        weights: dict[str, torch.Tensor],
        checkpoint: CheckpointFn | None,
        record: Record,
        watch: Watch | None = None,
        event: Callable[[str], None] | None = None,
        point: Point | None = None,
        mark_saved: Callable[[str], None] | None = None,
    ) -> None:
        self.case, self.device, self.tracker = case, device, tracker
        self.mark_saved = mark_saved or (lambda name: None)
        self.weights, self.checkpoint, self.record = weights, checkpoint, record
        self.watch, self.event = watch, event or (lambda label: None)
        self.point = point
        self.program = case.program
        self.streams = case_streams(case)

    def _stream(self, site: Site) -> contextlib.AbstractContextManager:
        stream = self.streams[site.name]
        if stream is None or self.tracker is None:
            return contextlib.nullcontext()
        return self.tracker.fork(stream)

    def _states(self, site: Site) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The value of the device's default generator and of the site's tracker stream, now."""
        stream, name = None, self.streams[site.name]
        if name is not None and self.tracker is not None:
            holder = self.tracker.generator(name) if hasattr(self.tracker, "generator") \
                else self.tracker.get_states()[name]
            stream = state_value(holder)
        return default_generator(self.device).get_state(), stream

    def _site(self, site: Site, h: torch.Tensor) -> torch.Tensor:
        # Only eager draws are watched: a state read during capture is relative to the capture.
        before = self._states(site) if self.watch is not None and not _capturing() else None
        dtype = torch_dtype(site.dtype)
        if h.dtype != dtype:  # a spec program's site may work in another dtype than its input
            h = h.to(dtype)
        with self._stream(site):
            out, drawn = ops.REGISTRY[site.op].apply(h, site.own_backend)
        if before is not None:
            after = self._states(site)
            stream_moved = before[1] is not None and not torch.equal(before[1], after[1])
            self.watch(site.name, not torch.equal(before[0], after[0]), stream_moved)  # type: ignore[misc]
        self.record(site.name, drawn)
        # The weight comes after the record on purpose: a non-reentrant recompute may stop early
        # once the last saved tensor is rebuilt (torch's early stop), and this multiply is what
        # saves last, so every RNG output is recorded before the stop.
        return out * self.weights[f"weight.{site.name}"]

    def _body(self, region: Region) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(h: torch.Tensor) -> torch.Tensor:
            self.event(f"{region.name} entry")
            dtype = h.dtype
            if region.passing is Passing.AUTOCAST:  # a matmul, which autocast runs in bfloat16
                h = (h @ self.weights[f"matrix.{region.name}"]).to(dtype)
            h = self._sequence(region.items, h)
            self.event(f"{region.name} exit")
            return h.to(dtype)  # autocast may have changed it (attention runs in bfloat16 there)

        return run

    def _context(self, region: Region) -> contextlib.AbstractContextManager:
        """The context a region is entered under: what backward does not have."""
        if region.passing is Passing.AUTOCAST:
            return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPE)
        if region.passing is Passing.SDPA_KERNEL and region.backend is not None:
            return ops.sdpa_context(region.backend)
        return contextlib.nullcontext()

    def _sequence(self, items: "tuple[Item, ...]", h: torch.Tensor,
                  top_level: bool = False) -> torch.Tensor:
        """Run `items` in order: each reads the output of the one before, except a parallel item,
        which reads the same input as the item before it and adds its output to that item's."""
        for first, *parallel in reading_groups(items):
            base = h  # the tensor the whole group reads
            h = self._item(first, base, top_level)
            for item in parallel:
                h = h + self._item(item, base, top_level).to(h.dtype)
        return h

    def _item(self, item: "Item", h: torch.Tensor, top_level: bool) -> torch.Tensor:
        if not isinstance(item, Region):
            save_region = getattr(self.checkpoint, "save_region", None)
            if item.save is not None and save_region is not None:
                # one SAVE region per site: the same kept activations and skipped draws as one
                # around the whole save(...) group, and a name unique in its checkpoint; its draw
                # is kept, not redrawn, so the recompute need not draw it (only where the impl
                # keeps SAVE regions: for every other impl the site is recomputed like the rest)
                self.mark_saved(item.name)
                return save_region(lambda t, site=item: self._site(site, t), f"save{item.save}.{item.name}")(h)
            return self._site(item, h)
        if top_level and self.point is not None and h.requires_grad:
            # Fires once the gradient of the region's input is complete: after the region's
            # backward, and so after its recompute.  Top-level regions only: an inner region's
            # forward tensors are not the ones a recompute's backward runs through.
            # The hook reaches the session's `point` through a weak reference: a tensor's hook that
            # held its run made a reference cycle (tensor -> hook -> run -> its tensors), and every
            # run's tensors waited for Python's cyclic collector (device memory, issue 42).
            point = weakref.WeakMethod(self.point) if inspect.ismethod(self.point) else lambda p=self.point: p
            h.register_hook(lambda grad, name=item.name, point=point: point()(f"in backward, after {name}'s recompute"))
        out = self._call(item, h)
        if top_level and self.point is not None:  # the caller's state once the region returned
            self.point(f"after {item.name} forward")
        return out

    def _call(self, region: Region, h: torch.Tensor) -> torch.Tensor:
        fn, args, kwargs = _entered(self._body(region), region.passing, h)
        with self._context(region):
            out = fn(*args, **kwargs) if self.checkpoint is None else self.checkpoint(fn, args, kwargs, h)
        self.record(region.name, out)  # what the caller got back from the region
        return out

    def forward(self, x: torch.Tensor, loss_weight: torch.Tensor) -> torch.Tensor:
        """The scalar loss (float32) of one forward pass through every region (recorded as ``loss``)."""
        # regions, and sites outside any (spec programs)
        h = self._sequence(self.program.items(), x, top_level=True)
        loss = (h.to(loss_weight.dtype) * loss_weight).float().sum()
        self.record(LOSS, loss)
        return loss

    def interleaved_draws(self, include_cpu: bool = True, include_device: bool = True) -> None:
        """Draw from every live stream, as other micro-batches would between forward and backward.

        `include_cpu` is False inside a CUDA graph, where a CPU draw would run once at capture
        instead of at every replay; `include_device` False draws from the CPU generator only.
        """
        if self.case.interleave is Interleave.NONE:
            return
        if include_cpu:
            torch.rand(INTERLEAVE_NUMEL)  # the CPU generator
        if not include_device:
            return
        if self.device.type == "cuda":
            torch.rand(INTERLEAVE_NUMEL, device=self.device)
        if self.tracker is not None:
            for name in self.tracker.names():
                with self.tracker.fork(name):
                    torch.rand(INTERLEAVE_NUMEL, device=self.device)
