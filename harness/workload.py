"""The model under test: regions and dropout sites laid out from a `Case`.

Each site multiplies by its own weight and draws a dropout mask with `torch.native_dropout`, which
returns the mask it drew; the mask is recorded under (iteration, site, phase).  What each region
call returns (its output, as the caller sees it) is recorded the same way under the region's name,
and the loss under ``loss``.  Which stream a site draws from follows the case's layout; how regions
contain sites and each other follows its nesting.  The same `Workload` runs the reference (no
checkpoint) and the checkpointed run, so the two differ only in the checkpoint function passed in.

With `watch` (the reference run), every eager site draw also reports which streams it advanced to
a `DrawWatch`, so the harness can check that the reference drew from the streams the layout says
before it trusts it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch

from .cases import Case, Interleave, Layout, Nesting
from .checkpoint.generators import default_generator
from .streams import snapshot_streams, state_value

SHAPE = (64, 64)  # 4096 elements per mask and per gradient
DROPOUT_P = 0.5
GLOBAL_SEED = 1234  # torch.manual_seed for CPU and every CUDA device
TRACKED_STREAM = "model-parallel"
SHARED_STREAMS = ("shared-a", "shared-b")  # shared-b is an alias of shared-a
STREAM_SEEDS = {TRACKED_STREAM: 2718, SHARED_STREAMS[0]: 3141}
INTERLEAVE_NUMEL = 1000  # per live stream, between forward and backward

FORWARD, RECOMPUTE = "forward", "recompute"
LOSS = "loss"  # the MaskLog name of the loss; region outputs go under the region's name
WARMUP, CAPTURE = -1, -2  # MaskLog iterations of the eager warm-up and of the capture itself

CheckpointFn = Callable[..., Any]  # checkpoint(fn, *args) -> fn(*args), checkpointed


@dataclass(frozen=True)
class Site:
    """One dropout: its name and the tracker stream it draws from (None: default generator)."""

    name: str
    stream: str | None


@dataclass(frozen=True)
class Region:
    """A checkpointed function made of sites and inner regions, in order."""

    name: str
    items: tuple[Union[Site, "Region"], ...]

    def sites(self) -> list[Site]:
        out: list[Site] = []
        for item in self.items:
            out.extend(item.sites() if isinstance(item, Region) else [item])
        return out


def _stream_for(layout: Layout, index: int) -> str | None:
    if layout in (Layout.DEFAULT, Layout.UNTRACKED):
        return None
    if layout is Layout.TRACKED:
        return TRACKED_STREAM
    if layout is Layout.MIXED:
        return None if index % 2 == 0 else TRACKED_STREAM
    return SHARED_STREAMS[index % 2]  # Layout.SHARED


def plan(case: Case) -> tuple[Region, ...]:
    """The top-level regions of `case`, with sites numbered s0, s1, ... in execution order."""
    sites = [Site(f"s{i}", _stream_for(case.layout, i)) for i in range(4)]
    if case.nesting is Nesting.FLAT:
        return (Region("r0", (sites[0], sites[1])),)
    if case.nesting is Nesting.NESTED:
        inner = Region("r1", (sites[1], sites[2]))
        return (Region("r0", (sites[0], inner, sites[3])),)
    return (Region("r0", (sites[0], sites[1])), Region("r1", (sites[2], sites[3])))


def seed_all() -> None:
    """`torch.manual_seed(GLOBAL_SEED)` for the CPU and every initialised CUDA device, directly.

    (torch.manual_seed on a machine where CUDA is not initialised queues a lazy CUDA call and
    records its stack, which costs more than the rest of a small case.)
    """
    from .checkpoint.generators import device_default_generators

    for gen in device_default_generators():
        gen.manual_seed(GLOBAL_SEED)


def make_tracker_streams(tracker: Any, layout: Layout) -> None:
    """Add the streams a layout uses to a fresh tracker (deterministic seeds)."""
    if tracker is None:
        return
    tracker.add(TRACKED_STREAM, STREAM_SEEDS[TRACKED_STREAM])
    if layout is Layout.SHARED:
        tracker.add(SHARED_STREAMS[0], STREAM_SEEDS[SHARED_STREAMS[0]])
        tracker.add_alias(SHARED_STREAMS[1], SHARED_STREAMS[0])


@dataclass
class Tensors:
    """Inputs and parameters of one case, made from a private generator (no global RNG used)."""

    x: torch.Tensor
    weights: dict[str, torch.Tensor]
    loss_weight: torch.Tensor

    @classmethod
    def make(cls, case: Case, device: torch.device) -> "Tensors":
        gen = torch.Generator().manual_seed(0)
        names = [site.name for region in plan(case) for site in region.sites()]

        def draw() -> torch.Tensor:
            return (torch.rand(SHAPE, generator=gen) + 0.5).to(device)

        return cls(draw(), {name: draw() for name in names}, draw())

    def fresh_leaves(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """New leaf tensors (requires_grad) with the same values, for one run."""
        x = self.x.clone().requires_grad_(True)
        weights = {k: v.clone().requires_grad_(True) for k, v in self.weights.items()}
        return x, weights


@dataclass
class MaskLog:
    """Masks by (iteration, site, phase); each key holds every draw in call order.

    Eagerly, `record` files a copy under the current iteration.  Under CUDA-graph capture the copy
    is a tensor of the graph's pool that every replay rewrites, so the runner calls `harvest(it)`
    after each replay to copy the captured buffers out under iteration `it`.
    """

    masks: dict[tuple[int, str, str], list[torch.Tensor]] = field(default_factory=dict)
    iteration: int = 0
    phase: str = FORWARD  # the runner switches to RECOMPUTE before calling backward
    captured: dict[tuple[str, str], list[torch.Tensor]] = field(default_factory=dict)

    def start(self, iteration: int) -> None:
        """Begin an iteration; a negative one (warm-up or capture) is not kept as a result."""
        self.iteration, self.phase = iteration, FORWARD
        if iteration < 0:
            self.captured = {}

    def record(self, site: str, mask: torch.Tensor) -> None:
        copy = mask.detach().clone()
        if self.iteration < 0:
            self.captured.setdefault((site, self.phase), []).append(copy)
        else:
            self.masks.setdefault((self.iteration, site, self.phase), []).append(copy)

    def harvest(self, iteration: int) -> None:
        """File the captured buffers' current contents under `iteration` (after a replay)."""
        for (site, phase), buffers in self.captured.items():
            self.masks[(iteration, site, phase)] = [b.clone() for b in buffers]


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


@dataclass
class DrawWatch:
    """Per site, for each eager draw: (advanced the device's default generator, advanced the
    site's tracker stream).  Filled by a watched `Workload`; read by `reference.check_reference`."""

    seen: dict[str, list[tuple[bool, bool]]] = field(default_factory=dict)

    def add(self, site: str, default_moved: bool, stream_moved: bool) -> None:
        self.seen.setdefault(site, []).append((default_moved, stream_moved))


def _capturing() -> bool:
    # Not checkpoint.rng._capturing: tests patch that one to fake a capture for the checkpoint,
    # while the watch must see whether a draw really happens inside a graph capture.
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Workload:
    """Builds the forward of one case around a checkpoint function (or none, for the reference)."""

    def __init__(
        self,
        case: Case,
        device: torch.device,
        tracker: Any,
        weights: dict[str, torch.Tensor],
        checkpoint: CheckpointFn | None,
        log: MaskLog,
        watch: DrawWatch | None = None,
    ) -> None:
        self.case, self.device, self.tracker = case, device, tracker
        self.weights, self.checkpoint, self.log = weights, checkpoint, log
        self.watch = watch
        self.regions = plan(case)
        self.events: list[tuple[int, str, dict[str, torch.Tensor]]] | None = None  # see `event`

    def event(self, label: str) -> None:
        """Record every stream's state under `label` (only when a timeline was asked for)."""
        if self.events is not None and self.log.iteration != WARMUP:
            self.events.append((self.log.iteration, label, snapshot_streams(self.tracker).states))

    def _stream(self, site: Site) -> contextlib.AbstractContextManager:
        if site.stream is None:
            return contextlib.nullcontext()
        return self.tracker.fork(site.stream)

    def _states(self, site: Site) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The value of the device's default generator and of the site's tracker stream, now."""
        stream = None
        if site.stream is not None:
            holder = self.tracker.generator(site.stream) if hasattr(self.tracker, "generator") \
                else self.tracker.get_states()[site.stream]
            stream = state_value(holder)
        return default_generator(self.device).get_state(), stream

    def _site(self, site: Site, h: torch.Tensor) -> torch.Tensor:
        # Only eager draws are watched: a state read during capture is relative to the capture.
        before = self._states(site) if self.watch is not None and not _capturing() else None
        with self._stream(site):
            h, mask = torch.native_dropout(h, DROPOUT_P, True)
        if before is not None:
            after = self._states(site)
            stream_moved = before[1] is not None and not torch.equal(before[1], after[1])
            self.watch.add(site.name, not torch.equal(before[0], after[0]), stream_moved)
        self.log.record(site.name, mask)
        # The weight comes after the record on purpose: a non-reentrant recompute may stop early
        # once the last saved tensor is rebuilt (torch's early stop), and this multiply is what
        # saves last, so every drawn mask is recorded before the stop.
        return h * self.weights[site.name]

    def _region_fn(self, region: Region) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(h: torch.Tensor) -> torch.Tensor:
            self.event(f"{self.log.phase} {region.name} entry")
            for item in region.items:
                h = self._call(item, h) if isinstance(item, Region) else self._site(item, h)
            self.event(f"{self.log.phase} {region.name} exit")
            return h

        return run

    def _call(self, region: Region, h: torch.Tensor) -> torch.Tensor:
        fn = self._region_fn(region)
        out = fn(h) if self.checkpoint is None else self.checkpoint(fn, h)
        self.log.record(region.name, out)  # what the caller got back from the region
        return out

    def forward(self, x: torch.Tensor, loss_weight: torch.Tensor) -> torch.Tensor:
        """The scalar loss of one forward pass through every region (recorded as ``loss``)."""
        h = x
        for region in self.regions:
            h = self._call(region, h)
        loss = (h * loss_weight).sum()
        self.log.record(LOSS, loss)
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

    def checkpointed_sites(self) -> list[str]:
        """Names of the sites inside a checkpointed region (all of them, in this workload)."""
        return [site.name for region in self.regions for site in region.sites()]

    def output_names(self) -> list[str]:
        """Names under which region outputs (every region, nested ones too) and the loss are kept."""
        names: list[str] = []

        def walk(region: Region) -> None:
            names.append(region.name)
            for item in region.items:
                if isinstance(item, Region):
                    walk(item)

        for region in self.regions:
            walk(region)
        return [*names, LOSS]

    def site_streams(self) -> dict[str, str | None]:
        """Site name -> tracker stream name (None: the default generator)."""
        return {site.name: site.stream for region in self.regions for site in region.sites()}
