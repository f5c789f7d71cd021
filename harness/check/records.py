"""What a run leaves behind: the records the workload fills and the oracles read.

The workload never hands its state to anyone: it reports every RNG output, region output and the
loss through `MaskLog.record` (the recording callback), and every eager site draw's stream
movement through `DrawWatch.add`.  The runner adds gradients and stream snapshots per iteration.
The oracles (`harness.check.oracles`) and the reference check (`harness.check.reference`) read `RunRecord`s
only, so tests can feed them synthetic records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .streams import StreamSnapshot

FORWARD, RECOMPUTE = "forward", "recompute"
LOSS = "loss"  # the MaskLog name of the loss; region outputs go under the region's name
WARMUP, CAPTURE = -1, -2  # MaskLog iterations of the eager warm-up and of the capture itself


@dataclass
class MaskLog:
    """RNG outputs (and region outputs, and the loss) by (iteration, name, phase); each key holds
    every record in call order.

    Eagerly, `record` files a copy under the current iteration.  Under CUDA-graph capture the copy
    is a tensor of the graph's pool that every replay rewrites, so the runner calls `harvest(it)`
    after each replay to copy the captured buffers out under iteration `it`.
    """

    masks: dict[tuple[int, str, str], list[torch.Tensor]] = field(default_factory=dict)
    iteration: int = 0
    phase: str = FORWARD  # the runner switches to RECOMPUTE before calling backward
    captured: dict[tuple[str, str], list[torch.Tensor]] = field(default_factory=dict)
    # (iteration, name) of forward draws made inside a region the checkpoint keeps rather than
    # recomputes (a torch_remat SAVE region): their absence from the recompute is by design.
    saved: set[tuple[int, str]] = field(default_factory=set)
    captured_saved: set[str] = field(default_factory=set)  # as `saved`, for the captured forward
    # names of draws made on the host (the CPU generator) while a CUDA graph was being captured:
    # their value is frozen into the graph, every replay repeats it (module mode: not capture-safe)
    frozen: set[str] = field(default_factory=set)

    def start(self, iteration: int) -> None:
        """Begin an iteration; a negative one (warm-up or capture) is not kept as a result."""
        self.iteration, self.phase = iteration, FORWARD
        if iteration < 0:
            self.captured, self.captured_saved = {}, set()

    def record(self, name: str, value: torch.Tensor) -> None:
        """File a copy of `value` under `name` in the current iteration and phase."""
        copy = value.detach().clone()
        if self.iteration < 0:
            self.captured.setdefault((name, self.phase), []).append(copy)
        else:
            self.masks.setdefault((self.iteration, name, self.phase), []).append(copy)

    def mark_saved(self, name: str) -> None:
        """Note that `name` drew in this iteration's forward inside a region the checkpoint saves
        instead of recomputing (a SAVE region): the recompute need not draw it again."""
        if self.phase != FORWARD:
            return
        if self.iteration < 0:
            # a captured forward: each replay draws it in a SAVE region too (`harvest`)
            self.captured_saved.add(name)
        else:
            self.saved.add((self.iteration, name))

    def harvest(self, iteration: int) -> None:
        """File the captured buffers' current contents under `iteration` (after a replay)."""
        for (name, phase), buffers in self.captured.items():
            self.masks[(iteration, name, phase)] = [b.clone() for b in buffers]
        self.saved.update((iteration, name) for name in self.captured_saved)


@dataclass
class DrawWatch:
    """Per site, for each eager draw: (advanced the device's default generator, advanced the
    site's tracker stream).  Filled by a watched workload; read by `reference.check_reference`."""

    seen: dict[str, list[tuple[bool, bool]]] = field(default_factory=dict)

    def add(self, site: str, default_moved: bool, stream_moved: bool) -> None:
        self.seen.setdefault(site, []).append((default_moved, stream_moved))


@dataclass
class RunRecord:
    """What one run (reference or checkpointed) left behind, per iteration.

    `log` holds RNG outputs (by site), region outputs (by region name) and the loss (``loss``);
    `grads` and `buffers` copies of the gradients and of the model's buffers after each backward;
    `objects_before` / `objects` the state object behind each tracker stream name before the run
    and after each iteration's backward; `watch` which streams each eager site draw advanced;
    `ambient` the ambient state (`harness.run.ambient`) after each top-level region's forward, after its
    backward (recompute included) and after the whole backward.
    """

    log: MaskLog
    grads: dict[int, dict[str, torch.Tensor | None]] = field(default_factory=dict)
    buffers: dict[int, dict[str, torch.Tensor | None]] = field(default_factory=dict)  # module mode's
    streams: dict[int, StreamSnapshot] = field(default_factory=dict)
    objects_before: dict[str, object] = field(default_factory=dict)
    objects: dict[int, dict[str, object]] = field(default_factory=dict)
    watch: DrawWatch = field(default_factory=DrawWatch)
    alias_problem: str = ""  # shared layout, reference run: why the alias is no alias ('' if it is)
    # iteration (WARMUP and CAPTURE too) -> [(point, `ambient.snapshot`)] in the order the points came
    ambient: dict[int, list[tuple[str, dict]]] = field(default_factory=dict)

    def draws(self, iteration: int, site: str, phase: str) -> list[torch.Tensor]:
        return self.log.masks.get((iteration, site, phase), [])

    def saved(self, iteration: int, site: str) -> bool:
        """Whether `site` drew in `iteration`'s forward inside a region its checkpoint saves."""
        return (iteration, site) in self.log.saved

    def names(self, iteration: int, phase: str) -> list[str]:
        """Every name with something recorded in `iteration` and `phase`, in first-seen order."""
        return [name for (it, name, ph) in self.log.masks if it == iteration and ph == phase]
