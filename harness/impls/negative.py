"""Negative controls: copies of `bundled` with one known RNG bug each.

The harness's own tests assert that every control is caught, and in which cells.  A harness that
cannot fail them is worthless.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._pytree import tree_leaves

from ..checkpoint import RecomputeRNGHook, RNGStatesTracker, StateValues, rng
from ..checkpoint.generators import device_default_generators
from ..checkpoint.rng import RNGPolicy, ValuePolicy, live_generators, resolve_capture_strategy
from .base import Adapter
from .bundled import BundledAdapter
from .remat import HookAdapter


def _handle(gen: torch.Generator) -> Any:
    """A live handle: a graph-safe alias of the state where torch has one, else the object itself."""
    if gen.device.type == "cuda" and hasattr(gen, "graphsafe_get_state"):
        return gen.graphsafe_get_state()
    return gen


def _point_at(gen: torch.Generator, handle: Any) -> None:
    """'Restore' from a handle: both forms share the live state, so this changes nothing."""
    if handle is gen:
        gen.set_state(handle.get_state())
    else:
        gen.graphsafe_set_state(handle)


class LiveHandlePolicy(ValuePolicy):
    """Bug: saves live generator handles (TransformerEngine #3833, Megatron graph-safe tracker).

    Forward advances the state the handles share, so the recompute draws at a later offset and the
    'restore afterwards' is a no-op too.
    """

    def snapshot(self, tracker: Any) -> list[tuple[torch.Generator, Any]]:
        return [(gen, _handle(gen)) for gen in live_generators(tracker)]

    def rewind(self, snapshot: list[tuple[torch.Generator, Any]]) -> Any:
        before = [(gen, _handle(gen)) for gen, _ in snapshot]
        for gen, handle in snapshot:
            _point_at(gen, handle)
        return before

    def restore(self, token: list[tuple[torch.Generator, Any]]) -> None:
        for gen, handle in token:
            _point_at(gen, handle)


class NoRestorePolicy(ValuePolicy):
    """Bug: rewinds for the recompute but leaves the streams where the recompute left them."""

    def restore(self, token: Any) -> None:
        pass


class IgnoreTrackerPolicy(ValuePolicy):
    """Bug: saves only the device default generators, never the tracker's streams."""

    def generators(self, tracker: Any) -> list[torch.Generator]:
        return device_default_generators()


class NoRewindPolicy(ValuePolicy):
    """Bug: does not rewind at all (as with `preserve_rng_state=False`)."""

    def rewind(self, snapshot: Any) -> Any:
        return None

    def restore(self, token: Any) -> None:
        pass


class TwoSlotPolicy(ValuePolicy):
    """Bug: keeps its snapshots in a pool of two slots, as a checkpoint with a fixed snapshot
    buffer would.  A slot is free again once its region has rewound for its recompute; with a
    third region pending, the oldest pending slot is overwritten.  Right with one or two regions
    pending at once (flat, nested, siblings), wrong with three (deep, wide)."""

    def __init__(self) -> None:
        super().__init__()
        self.slots: list[Any] = [None, None]
        self.pending: list[int] = []  # slot numbers in use, oldest first

    def snapshot(self, tracker: Any) -> int:
        taken = super().snapshot(tracker)
        free = [n for n in range(len(self.slots)) if n not in self.pending]
        slot = free[0] if free else self.pending.pop(0)  # no free slot: overwrite the oldest
        self.slots[slot] = taken
        self.pending.append(slot)
        return slot

    def rewind(self, slot: int) -> Any:
        if slot in self.pending:
            self.pending.remove(slot)
        return super().rewind(self.slots[slot])


def _control(name: str, policy: ValuePolicy, description: str) -> Adapter:
    # Under capture the controls rewind with values too, so their bug is exercised in graphs.
    policy.capture_strategy = "values"
    adapter = BundledAdapter()
    adapter.name, adapter.policy, adapter.description = name, policy, description
    return adapter


def make_live_handles() -> Adapter:
    return _control("neg-live-handles", LiveHandlePolicy(), "saves live generator handles, not values")


def make_no_restore() -> Adapter:
    return _control("neg-no-restore", NoRestorePolicy(), "does not restore live streams after recompute")


def make_ignore_tracker() -> Adapter:
    return _control("neg-ignore-tracker", IgnoreTrackerPolicy(), "ignores tracker streams")


def make_host_values() -> Adapter:
    return _control(
        "neg-host-values", ValuePolicy(),
        "rewinds with capture-relative host-side values: right in one graph, wrong across separate graphs",
    )


def make_no_rewind() -> Adapter:
    return _control("neg-no-rewind", NoRewindPolicy(), "never rewinds for the recompute")


def make_two_slots() -> Adapter:
    return _control("neg-two-slots", TwoSlotPolicy(),
                    "keeps snapshots in two slots: wrong once three regions have recomputes pending")


# --- controls only ranks can catch (issue 41: `--ranks N`; in one process, rank 0, each is bundled) --


def _group_world() -> int:
    """The size of the process group this process belongs to (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _from_rank_zero(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Rank 0's `values` on every rank of the group (a collective: every rank calls it alike)."""
    import torch.distributed as dist

    box: list[Any] = [[value.cpu() for value in values]]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class _RankControlPolicy(ValuePolicy):
    """A control only ranks catch: in one process it is `bundled`, capture strategy included (the
    values strategy of the other controls is neg-host-values' bug across separate graphs, seen in
    the CUDA matrix on an H100, torch 2.11: 49 separate-graph cells of each); with ranks it rewinds
    with values under capture too, so its bug is exercised in graphs."""

    def strategy(self) -> str:
        return super().strategy() if _group_world() > 1 else resolve_capture_strategy(RNGPolicy.capture_strategy)


class RankZeroSnapshotPolicy(_RankControlPolicy):
    """Bug: every rank takes its snapshot from rank 0 (one snapshot broadcast to the group, as a
    checkpoint that saves RNG state once for all ranks would).  The streams every rank seeds
    alike hold the same values anyway; a stream seeded per TP rank is rewound to rank 0's state
    on every other rank, so their recompute draws rank 0's numbers."""

    def snapshot(self, tracker: Any) -> StateValues:
        taken = super().snapshot(tracker)
        if _group_world() == 1:
            return taken
        values = _from_rank_zero([value for _, value in taken.entries])
        return StateValues([(gen, value) for (gen, _), value in zip(taken.entries, values)])


class RankReseedPolicy(_RankControlPolicy):
    """Bug: at the recompute, re-derives each tracker stream seeded per rank (per TP or CP rank)
    from the seed every rank shares (the stream's seed without its rank offset, as code that
    reseeds from the model's seed would), at the right position: the recompute of every rank
    draws what rank 0 drew.  A CUDA generator's state is (seed, Philox offset), so the stream is rebuilt
    locally; a CPU generator's state has no offset, so there rank 0's snapshot of the stream,
    the same numbers, stands in (a broadcast at every snapshot)."""

    def _per_rank(self, tracker: Any) -> list[tuple[str, torch.Generator]]:
        from ..rank_context import STREAM_AXES

        names = tracker.names() if tracker is not None and hasattr(tracker, "names") else []
        return [(name, tracker.generator(name)) for name in names if name in STREAM_AXES]

    def snapshot(self, tracker: Any) -> Any:
        taken = super().snapshot(tracker)
        streams = self._per_rank(tracker) if _group_world() > 1 else []
        cpu = [gen for _, gen in streams if gen.device.type == "cpu"]
        shared = list(zip(cpu, _from_rank_zero([gen.get_state() for gen in cpu]))) if cpu else []
        cuda = [(name, gen) for name, gen in streams if gen.device.type == "cuda"]
        return taken, shared, cuda

    def rewind(self, snapshot: Any) -> Any:
        from ..rank_context import current

        taken, shared, cuda = snapshot
        before = super().rewind(taken)
        for gen, value in shared:
            gen.set_state(value)
        if cuda and torch.cuda.is_current_stream_capturing():
            cuda = []  # get_offset raises during capture: eager only, under capture it is a control of values
        for name, gen in cuda:
            offset = gen.get_offset()
            gen.manual_seed(gen.initial_seed() - current().seed_offset(name))
            gen.set_offset(offset)
        return before


class ContextParallelBlindPolicy(_RankControlPolicy):
    """Bug: shares one snapshot across each context-parallel group: every rank rewinds to the
    snapshot of the rank with its TP and DP coordinates at CP rank 0 (a checkpoint that builds its
    snapshot group from TP and DP alone and takes the context-parallel ranks for replicas would).
    Every stream whose seed does not follow the CP rank (the default generators, the tracked and
    data-parallel streams) holds the same values across a CP group anyway; the context-parallel
    and model-and-context-parallel streams do not, so on CP rank 1 the recompute draws them at CP
    rank 0's state.  Eager only: under capture it is `bundled` (one-process values strategy)."""

    def snapshot(self, tracker: Any) -> StateValues:
        taken = super().snapshot(tracker)
        if _group_world() == 1 or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return taken
        values = _from_context_parallel_rank_zero([value for _, value in taken.entries])
        return StateValues([(gen, value) for (gen, _), value in zip(taken.entries, values)])


def _from_context_parallel_rank_zero(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """The `values` of the rank with this rank's TP and DP coordinates at CP rank 0 (a collective:
    every rank calls it alike)."""
    import torch.distributed as dist

    from ..rank_context import current

    place = current()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [value.cpu() for value in values])
    return everyone[place.tp_rank + place.tp * place.cp * place.dp_rank]


def make_rank0_snapshot() -> Adapter:
    return _control("neg-rank0-snapshot", RankZeroSnapshotPolicy(),
                    "restores every rank from rank 0's snapshot (only ranks show it)")


def make_rank_reseed() -> Adapter:
    return _control("neg-rank-reseed", RankReseedPolicy(),
                    "reseeds the per-TP-rank streams alike on every rank at the recompute (only ranks show it)")


def make_rank_cp_blind() -> Adapter:
    return _control("neg-rank-cp-blind", ContextParallelBlindPolicy(),
                    "rewinds every rank to the snapshot of its CP rank 0 (only ranks with --cp 2 or more show it)")


# --- controls that prove the other oracles and the reference check can fail ----------------------


class NoRecomputeAdapter(BundledAdapter):
    """Bug: keeps the region's activations and never recomputes (not a checkpoint at all).

    Masks, gradients and streams all match the reference; only the recompute-mask oracle's "the
    site was never recomputed" can tell.
    """

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class StaleRNGAdapter(BundledAdapter):
    """Bug: puts every live stream back where it was after a region's forward, as a graph that
    replays stale RNG would: the next iteration redraws the same masks (fresh-randomness)."""

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        before = StateValues.take(live_generators(tracker))
        out = super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)
        before.write_back()
        return out


def _busiest_device() -> torch.device:
    """Where a region with no tensor argument and no tracker computes: CUDA where there is one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class ExtraDrawAdapter(BundledAdapter):
    """Bug: the checkpoint draws from the device's default generator before running the region,
    so the forward's masks are not the reference's (forward-mask)."""

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else getattr(tracker, "device", None) or _busiest_device()
        torch.empty(1, device=device).uniform_()
        return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)


class WrongOutputAdapter(BundledAdapter):
    """Bug: returns the region's output with one element changed by a constant; masks, gradients
    of the region's inputs and streams stay right (output)."""

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        out = super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)
        bump = torch.zeros_like(out)
        bump.view(-1)[:1].fill_(1.0)  # a kernel, no host copy: fine inside a CUDA graph capture
        return out + bump  # a constant: the gradient of `out` is unchanged


class ReplaceStreamsPolicy(ValuePolicy):
    """Bug: after the recompute, gives every tracker stream a new generator object holding the
    right value (aliases kept aliased) instead of rewinding the live one in place (identity).
    Eager only: torch refuses to make a generator during a CUDA graph capture."""

    def snapshot(self, tracker: Any) -> Any:
        return tracker, super().snapshot(tracker)

    def rewind(self, snapshot: Any) -> Any:
        tracker, values = snapshot
        return tracker, super().rewind(values)

    def restore(self, token: Any) -> None:
        tracker, values = token
        super().restore(values)
        streams = getattr(tracker, "_streams", None)
        if streams is None or rng._capturing():  # no generator can be made during a capture: eager only
            return
        replaced: dict[int, torch.Generator] = {}
        for name, gen in list(streams.items()):
            if id(gen) not in replaced:
                replaced[id(gen)] = _copy_of(gen)
            streams[name] = replaced[id(gen)]


def _copy_of(gen: torch.Generator) -> torch.Generator:
    """A new generator object holding `gen`'s state."""
    fresh = torch.Generator(device=gen.device)
    fresh.set_state(gen.get_state())
    return fresh


class InertForkTracker(RNGStatesTracker):
    """A tracker whose `fork()` silently does nothing: every 'tracked' draw is a default draw."""

    @contextlib.contextmanager
    def fork(self, name: str) -> Iterator[None]:
        self._stream(name)  # the name must exist; nothing is switched
        yield


class CopiedAliasTracker(RNGStatesTracker):
    """A tracker whose `add_alias` makes a second stream with a copy of the state, not an alias."""

    def add_alias(self, alias: str, name: str) -> None:
        self.add(alias, 0).set_state(self._stream(name).get_state())


class CopiedAliasAdapter(BundledAdapter):
    """Bug: its tracker's aliases are copies.  The shared layout's alias checks would hold by
    construction; the reference check refuses such a tracker."""

    def make_tracker(self, device: Any) -> Any:
        return CopiedAliasTracker(device)


class InertForkAdapter(BundledAdapter):
    """Bug: its tracker's `fork()` does nothing.  A checkpoint that saves only the default
    generator then passes the tracked layouts vacuously; the reference check makes them errors."""

    def make_tracker(self, device: Any) -> Any:
        return InertForkTracker(device)


def _variant(cls: type, name: str, description: str) -> Adapter:
    # The bundled checkpoint as it is (default policy, capture strategy 'auto'): the one bug of
    # these controls is in their adapter or tracker, so it is the only difference from `bundled`.
    adapter = cls()
    adapter.name, adapter.description = name, description
    return adapter


def make_no_recompute() -> Adapter:
    return _variant(NoRecomputeAdapter, "neg-no-recompute", "keeps activations, never recomputes")


def make_stale_rng() -> Adapter:
    return _variant(StaleRNGAdapter, "neg-stale-rng", "puts every stream back after a region's forward")


def make_extra_draw() -> Adapter:
    return _variant(ExtraDrawAdapter, "neg-extra-draw", "draws from the default generator before each region")


def make_wrong_output() -> Adapter:
    return _variant(WrongOutputAdapter, "neg-wrong-output", "returns the region's output with one element changed")


def make_replace_streams() -> Adapter:
    return _control("neg-replace-streams", ReplaceStreamsPolicy(),
                    "replaces tracker stream objects after the recompute instead of rewinding in place")


def make_inert_fork() -> Adapter:
    return _variant(InertForkAdapter, "neg-inert-fork", "its tracker's fork() does nothing")


def make_copied_alias() -> Adapter:
    return _variant(CopiedAliasAdapter, "neg-copied-alias", "its tracker's add_alias makes a copy")


class _EagerBugAdapter(BundledAdapter):
    """`bundled`, with a bug that can only run eagerly (host-side state, or a stream switch that
    would break a capture): `eager` says whether the current case is eager (set per case in
    `supports`, which the runner calls once before the case runs); under capture it is `bundled`."""

    eager = True

    def supports(self, case: Any) -> str | None:
        self.eager = case.capture.value == "eager"
        return super().supports(case)


# --- leaked ambient state (issue 29): each control's only bug is one piece it never puts back --------


def _leak_sdpa(device: Any) -> None:
    # As a checkpoint that sets the forward's attention backend for its recompute would: only the
    # math backend left enabled, the caller's flags never put back.
    for kind in ("flash", "mem_efficient", "cudnn"):
        setter = getattr(torch.backends.cuda, f"enable_{kind}_sdp", None)
        if setter is not None:
            setter(False)


def _leak_deterministic(device: Any) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)


def _leak_default_dtype(device: Any) -> None:
    torch.set_default_dtype(torch.float64)


def _leak_autocast(device: Any) -> None:
    # As a checkpoint that enters the forward's autocast by hand and returns before leaving it.
    torch.set_autocast_enabled(device.type, True)


def _leak_stream(device: Any) -> None:
    if device.type == "cuda":  # on the CPU there is no stream to leak: the control is `bundled` there
        torch.cuda.set_stream(torch.cuda.Stream(device))


# control -> (what it leaks, when: "backward" (as the region's backward starts: the leak outlives
# backward, this being process-wide state) or "forward" (after the region: the rest of the forward
# runs under it), the leak)
LEAKS: dict[str, tuple[str, str, Any]] = {
    "neg-leak-sdpa": ("the SDPA backend flags changed (only math enabled)", "backward", _leak_sdpa),
    "neg-leak-deterministic": ("deterministic algorithms on (warn only)", "backward", _leak_deterministic),
    "neg-leak-default-dtype": ("the default dtype set to float64", "backward", _leak_default_dtype),
    "neg-leak-autocast": ("autocast enabled on the region's device", "forward", _leak_autocast),
    "neg-leak-stream": ("a new CUDA stream current", "forward", _leak_stream),
}


class LeakAdapter(_EagerBugAdapter):
    """Bug: `bundled`, but its checkpoint leaves one piece of ambient state changed (`LEAKS`):
    from the region's backward on, or after the region's forward.  The leak is set outside
    bundled's own recompute context (which puts the caller's SDPA flags and autocast back after
    the recompute), as a checkpoint that sets state for its recompute and never puts it back
    would.  RNG streams, masks and, for most pieces, gradients stay right: only the ambient oracle
    is sure to see it."""

    leak = "neg-leak-sdpa"

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        _, when, leak = LEAKS[self.leak]
        out = super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)
        if self.leak == "neg-leak-stream" and not self.eager:  # a stream switch would break a capture
            return out
        if when == "forward":
            leak(out.device)
        elif out.requires_grad:  # fires as the region's backward (its recompute) begins
            out.register_hook(lambda grad: leak(out.device))
        return out


def _leaking(name: str) -> Adapter:
    what, when, _ = LEAKS[name]
    adapter = _variant(LeakAdapter, name,
                       f"leaves {what} {'from a region backward on' if when == 'backward' else 'after each region'}")
    adapter.leak = name
    return adapter


def make_leak_sdpa() -> Adapter:
    return _leaking("neg-leak-sdpa")


def make_leak_deterministic() -> Adapter:
    return _leaking("neg-leak-deterministic")


def make_leak_default_dtype() -> Adapter:
    return _leaking("neg-leak-default-dtype")


def make_leak_autocast() -> Adapter:
    return _leaking("neg-leak-autocast")


def make_leak_stream() -> Adapter:
    return _leaking("neg-leak-stream")


# --- bugs the matrix could not see before issue 29: shared inputs, a third step ---------------------


class IdPoolAdapter(_EagerBugAdapter):
    """Bug: keeps each region's RNG snapshot in a pool keyed by ``id()`` of its input tensor and
    rewinds its recompute from there.  Two pending regions that receive one tensor (parallel
    branches) share a key: the later region's snapshot replaces the earlier's, whose recompute
    then redraws the later region's numbers.  (An inner region that is its outer region's first
    item shares the outer's key too, but nothing draws between their entries: the same snapshot.)
    Its snapshots are host values, so under capture, and for a region that receives no tensor (a
    closure), it is `bundled`.  The pool holds each key's tensor too: a freed tensor's id() may
    come back for an unrelated tensor (CPython reuses the slot), which would make which regions
    collide depend on the allocator, not on the program (seen on the H200: a region fed an
    intermediate of an earlier region shared its key with a later region's input)."""

    def supports(self, case: Any) -> str | None:
        self.pool: dict[int, StateValues] = {}  # a fresh pool per case
        self.keys: dict[int, torch.Tensor] = {}  # keeps every key's tensor alive: no id() reuse
        return super().supports(case)

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not (tensors and self.eager):
            return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)
        key = id(tensors[0])
        self.keys[key] = tensors[0]
        self.pool[key] = StateValues.take(live_generators(tracker))
        calls = [0]

        def rewound_from_the_pool(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            if calls[0] > 1:  # the recompute: rewind to the pool's snapshot for this input
                self.pool[key].write_back()
            return fn(*a, **k)

        return super().checkpoint(rewound_from_the_pool, *args, reentrant=reentrant, tracker=tracker, **kwargs)


class StaleThirdStepAdapter(_EagerBugAdapter):
    """Bug: one snapshot slot per region call of a training step, refreshed during the first two
    steps only (as buffers filled while warming up and then assumed to be refilled by a graph
    replay): from the third step on every recompute rewinds to the second step's state.  Every
    two-iteration case passes.  Its snapshots are host values: under capture it is `bundled`."""

    def supports(self, case: Any) -> str | None:
        # every case starts at step 0 with no slots
        self.step, self.ordinal, self.recomputed, self.recomputing = 0, 0, False, 0
        self.slots: dict[int, StateValues] = {}
        return super().supports(case)

    def checkpoint(self, fn: Any, *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        slot = None
        # inside a recompute (an inner region called again: no step of its own) or under capture,
        # it is `bundled`; a region called in a forward takes the next slot of the step
        if not self.recomputing and self.eager:
            if self.recomputed:  # a forward after a backward: the next step
                self.step, self.ordinal, self.recomputed = self.step + 1, 0, False
            slot, self.ordinal = self.ordinal, self.ordinal + 1
            if self.step < 2:
                self.slots[slot] = StateValues.take(live_generators(tracker))
        calls = [0]

        def rewound_from_the_slot(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                return fn(*a, **k)
            self.recomputed = True
            if slot is not None:
                self.slots[slot].write_back()
            self.recomputing += 1  # the regions it calls again are part of this recompute
            try:
                return fn(*a, **k)
            finally:
                self.recomputing -= 1

        return super().checkpoint(rewound_from_the_slot, *args, reentrant=reentrant, tracker=tracker, **kwargs)


def make_id_pool() -> Adapter:
    return _variant(IdPoolAdapter, "neg-id-pool", "keys its RNG snapshots by id() of the region's input")


def make_stale_third_step() -> Adapter:
    return _variant(StaleThirdStepAdapter, "neg-stale-third-step",
                    "refreshes its per-step snapshot slots in the first two steps only")


# --- controls over torch_remat: hooks that do not realign after a SAVE body (issue 57) -------------


class SaveBlindRNGHook(RecomputeRNGHook):
    """Bug: a `RecomputeRNGHook` that puts every stream back at region entry (and where torch_remat
    reinstates the outer state after the recompute), but after a SAVE region's body only what
    `after_save` covers (None: nothing), as a hook written for region entry alone would.

    torch_remat calls `snapshot` at region entry and at each SAVE body's exit in forward, and once
    more when the recompute starts (the outer state); the recompute restores the entry snapshot,
    each SAVE exit snapshot where it skips that body, and the outer one last.  This hook numbers
    its snapshots: the ones between the first and the latest are the SAVE exits.  The body's draws
    are kept, not made again, so a stream it drew from that is not put back stays behind, and every
    later draw of that stream in the recompute shifts."""

    def __init__(self, tracker: Any = None, after_save: "RecomputeRNGHook | None" = None) -> None:
        super().__init__(tracker)
        self.after_save = after_save
        self.taken = 0

    def snapshot(self) -> Any:
        """(its number, value copies of every live generator, `after_save`'s own snapshot)."""
        number, self.taken = self.taken, self.taken + 1
        return number, super().snapshot(), self.after_save.snapshot() if self.after_save else None

    def restore(self, state: Any) -> None:
        """Writes every stream back, or at a SAVE body's exit only what `after_save` covers."""
        number, values, part = state
        if number == 0 or number == self.taken - 1:
            super().restore(values)
        elif self.after_save is not None:
            self.after_save.restore(part)


class RematSaveBlindAdapter(HookAdapter):
    """`remat-hook` with a `SaveBlindRNGHook`: right wherever no SAVE body draws from a stream it
    leaves behind before a later draw of that stream in its region."""

    name = "neg-remat-entry-only"
    must_support_all = False
    description = "torch_remat.checkpoint with a hook that restores at region entry, not after a SAVE region's body"
    defaults_after_save = False  # True: the default generators are put back after a SAVE body

    def hooks(self, args: tuple, kwargs: dict, tracker: Any) -> tuple:
        return (SaveBlindRNGHook(tracker, RecomputeRNGHook(None) if self.defaults_after_save else None),)


class RematSaveNoTrackerAdapter(RematSaveBlindAdapter):
    name = "neg-remat-save-no-tracker"
    description = ("torch_remat.checkpoint with a hook that restores every stream at region entry, and after a "
                   "SAVE region's body only the default generators (no tracker stream)")
    defaults_after_save = True


def make_remat_entry_only() -> Adapter:
    return RematSaveBlindAdapter()


def make_remat_save_no_tracker() -> Adapter:
    return RematSaveNoTrackerAdapter()
