"""The draw simulation of `models` (`replay`): the reference run and the checkpointed run of a
case side by side, streams as the sequences of draws they made, with each checkpoint's snapshots,
recomputes and restores as the behaviours of its impl (`effects.Effects`) make them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..model import ops
from ..model.cases import Case
from ..model.programs import Passing, Region, Site, reading_groups

if TYPE_CHECKING:
    from .effects import Effects

State = defaultdict  # stream -> the draws it made, in order (`replay`)


@dataclass
class Frame:
    """One checkpoint call in the replay: its snapshot, and where the impl keeps it (a slot of a
    fixed pool, the ordinal of the call in its step), None where it keeps its own."""

    state: Any
    slot: "int | None" = None
    ordinal: "int | None" = None
    key: Any = None  # `input-keyed-snapshots`: (recompute pass or 0, the input tensor) its snapshot is kept under


def _stream_key(code: str, device: str) -> str:
    """A site's stream code as the generator it draws from (b is an alias of a; on the CPU the
    device's default generator is the CPU generator)."""
    if code == "b":
        return "a"
    if code == "d":
        return "cpu" if device == "cpu" else "d"
    return code


def draws(site: Site) -> bool:
    return ops.REGISTRY[site.op].draws


def backward_order(items: Sequence[Any]) -> list[Region]:
    """The regions in the order backward recomputes them: the last top-level region first, each
    region before the regions inside it (they recompute within its backward)."""
    out: list[Region] = []
    for region in reversed([item for item in items if isinstance(item, Region)]):
        out.append(region)
        out.extend(backward_order(region.items))
    return out


def unpack_order(program: Any, nested_frames: bool = False) -> list[Region]:
    """The order in which a non-reentrant backward recomputes the regions: each region's frame
    recomputes when backward first needs a tensor it saved itself, i.e. at its last own site
    (inner regions' tensors are their own frames'), the latest first; a region with no own site
    saves nothing and never recomputes on its own.

    `nested_frames` (torch's checkpoint, the ``nested-frames`` trait): an inner region's inputs
    are saved by its enclosing region's frame (its own input too: the frame keeps a holder for
    every tensor saved under it, filled only by its recompute), so the inner recompute unpacks
    them first and the enclosing region recomputes before it (as late as the inner one)."""
    key = recompute_points(program, nested_frames)
    depth: dict[int, int] = {}
    enclosing = enclosing_regions(program.items())
    for region in program.all_regions():
        parent = enclosing.get(id(region))
        depth[id(region)] = 0 if parent is None else depth[id(parent)] + 1
    ranked = [region for region in program.all_regions() if id(region) in key]
    # the latest first; of two at the same point, the enclosing one (outer before inner)
    return sorted(ranked, key=lambda r: (-key[id(r)], depth[id(r)]))


def stop_point(region: Region, nested_frames: bool = False) -> "float | None":
    """Where a non-reentrant recompute of `region` that stops early (torch's) stops: at its last
    own site, the last tensor its frame saved; with `nested_frames` its frame also holds the
    inputs of its inner regions, so it reruns at least what comes before each of them.  None:
    it saves nothing and reruns nothing."""
    points = [float(item.index) for item in region.items if isinstance(item, Site)]
    if nested_frames:
        points += [sites[0].index - 0.5 for item in region.items if isinstance(item, Region)
                   for sites in [item.sites()] if sites]
    return max(points) if points else None


def _reruns(outer: Region, inner: Region, nested_frames: bool) -> bool:
    """Whether a non-reentrant recompute of `outer` that stops early reaches `inner` (one of its
    regions, at any depth): `inner` starts before the point it stops at."""
    stop, sites = stop_point(outer, nested_frames), inner.sites()
    return stop is not None and bool(sites) and sites[0].index < stop


def recompute_points(program: Any, nested_frames: bool = False) -> dict[int, float]:
    """Region (id) -> the site index at which a non-reentrant backward first needs a tensor its
    frame saved (`unpack_order`); regions that save nothing are absent."""
    key: dict[int, float] = {}
    for region in program.all_regions():  # outer before inner
        own = [float(item.index) for item in region.items if isinstance(item, Site)]
        sites = region.sites()
        if region.passing is Passing.AUTOCAST and sites:
            own.append(sites[0].index - 0.5)  # the matmul an autocast region starts with saves its input
        if own:
            key[id(region)] = max(own)
    if nested_frames:
        enclosing = enclosing_regions(program.items())
        for region in reversed(program.all_regions()):  # inner before outer: keys move outwards
            parent = enclosing.get(id(region))
            if parent is not None and id(region) in key:
                key[id(parent)] = max(key.get(id(parent), key[id(region)]), key[id(region)])
    return key


def enclosing_regions(items: Sequence[Any], parent: "Region | None" = None) -> dict[int, "Region | None"]:
    out: dict[int, Region | None] = {}
    for item in items:
        if isinstance(item, Region):
            out[id(item)] = parent
            out.update(enclosing_regions(item.items, item))
    return out


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
    `unpack_order`, each from its forward snapshot.  A recompute rewinds the streams it saves
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
    enclosing = enclosing_regions(program.items())
    keys = {*key.values(), "cpu" if device == "cpu" else "d"}
    interleave = case.interleave.value == "draws"
    # (a site in a SAVE region counts only where the impl keeps SAVE regions: `skips-save-regions`)
    checkpointed = {site.name for site in program.checkpointed_sites()
                    if site.save is None or effects.save_skip is None}

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
            parent = enclosing.get(id(walk))
            if parent is not None and early and not _reruns(parent, walk, effects.nested_frames):
                break  # the enclosing recompute stops before it: its snapshot is the forward's
            walk = parent
        return found

    def fail(oracles: Sequence[str], cause: int) -> None:
        for oracle in oracles:
            causes.setdefault(oracle, set()).add(cause)

    # Where snapshots are kept (`snapshot-slots`, `snapshots-frozen`): a region's recompute
    # rewinds to what its ticket finds there, which may be another region's or step's state.
    slots: list[State] = [State(tuple)] * (effects.slots[0] if effects.slots else 0)
    pending: list[int] = []  # slots in use, oldest first
    by_ordinal: dict[int, State] = {}  # `snapshots-frozen`: the state kept per region call of a step
    by_input: dict[Any, State] = {}  # `input-keyed-snapshots`: the state kept per input tensor
    step = {"number": 0, "ordinal": 0, "recomputing": 0, "pass": 0}

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
        if effects.input_keys and id(region) in effects.input_keys[0]:
            # a recompute calls its inner regions with new tensors: keys of that pass, which
            # siblings reading one tensor share all the same
            frame.key = (step["pass"] if step["recomputing"] else 0, effects.input_keys[0][id(region)])
            by_input[frame.key] = frame.state
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
        if frame.key is not None:
            found = by_input[frame.key]
            index = effects.input_keys[1] if found is not frame.state else -1
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
    # `host-rewind` under separate graphs: one pass is the capture of the forward graph and of the
    # backward graph, positions relative to each graph; `_graph_replays` then replays them
    graphs = effects.host_rewind is not None
    recomputed: list[tuple[str, bool]] = []  # (stream, whether a gradient uses it) per rerun draw
    for iteration in range(1 if graphs else program.iterations):
        step.update(number=iteration, ordinal=0)
        ref_fwd: dict[str, int] = {}
        for site in program.sites():
            if draws(site):
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
                    if draws(item):
                        ck_fwd[item.name] = ck[key[item.name]]
                        ck[key[item.name]] += (token[item.name],)
                    if item.save is not None:
                        save_exit[item.name] = State(tuple, ck)  # what a hook snapshots there

        save_exit: dict[str, State] = {}
        forward(program.items())
        for name, position in ck_fwd.items():
            if position != ref_fwd[name]:
                fail(("forward-mask", "output", "gradient"), moved_by.get(key[name], -1))
            if last_fwd.get(name) == position and token[name].split(".")[0] in ops.RECORDS_THE_DRAW:
                fail(("fresh-randomness",), moved_by.get(key[name], -1))
        last_fwd = dict(ck_fwd)
        if graphs:  # the backward graph's capture starts at its own offset 0
            forward_increment, ck = dict(ck), State(tuple)
        elif interleave:
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
            # `rank-zero-rewind`: on every rank but rank 0 a stream seeded per rank is rewound to
            # rank 0's state, another sequence than this rank's (the numbers rank 0 drew)
            rank_zero: dict[str, int] = {}
            if effects.rank_zero is not None:
                for stream in effects.rank_zero[0] & set(keys):
                    if stream not in free:
                        ck[stream] += ("rank 0",)
                        rank_zero[stream] = effects.rank_zero[1]
            mine = {id(item) for item in region.items if not isinstance(item, Region)}
            stop_at = stop_point(region, effects.nested_frames) if early else None
            inner_snaps: dict[int, Frame] = {}
            shift: dict[str, int] = {}  # stream -> the entry whose saved op shifted it in this pass
            shifted_by: dict[str, str] = {}  # stream -> what shifted it (for the note)

            def rerun(items: Sequence[Any]) -> bool:
                for item in items:
                    first = item.sites()[0].index if isinstance(item, Region) and item.sites() else (
                        None if isinstance(item, Region) else item.index)
                    if stop_at is not None and first is not None and first > stop_at:
                        return True  # the early stop: what its frame saved is all recomputed
                    if isinstance(item, Region):
                        enter(inner_snaps, item)
                        if rerun(item.items):
                            return True
                        leave(inner_snaps, item)
                        continue
                    if effects.save_skip and item.save is not None:
                        _skip_save_body(item, effects.save_skip, keys, key, ck, save_exit[item.name], shift,
                                        shifted_by)
                        continue
                    rerun_sites.add(item.name)
                    if draws(item):
                        stream = key[item.name]
                        if item.name in saved_out:
                            shift.setdefault(stream, saved_out[item.name])
                            shifted_by.setdefault(stream, "an earlier draw of its stream was saved by the policy, "
                                                          "not rerun")
                        else:
                            # Non-reentrant, a draw the region's own saved tensors do not depend on
                            # (an inner region's site that no own site of the region reads after it:
                            # after the region's last own site, or beside it in one reading group;
                            # that inner region recomputes its own) changes no gradient.
                            used = reentrant or id(item) in mine or _read_later(region, item)
                            if ck[stream] != ck_fwd[item.name]:
                                cause = free.get(stream, shift.get(stream, rank_zero.get(
                                    stream, stored_by if stored_by >= 0 else moved_by.get(stream, -1))))
                                fail(("recompute-mask", "gradient") if used else ("recompute-mask",), cause)
                                if stream in rank_zero and token[item.name].split(".")[0] in ops.RECORDS_THE_DRAW:
                                    fail(("rank-streams",), cause)  # rank 0's numbers where they must differ
                                how = ("from where the stream is live: the checkpoint does not save it"
                                       if stream in free else f"shifted: {shifted_by[stream]}" if stream in shift else
                                       "from rank 0's state of its stream, which is seeded per rank"
                                       if stream in rank_zero else "at another position")
                                notes.setdefault(cause, f"{region.name}'s recompute redraws {item.name}@"
                                                        f"{code[item.name]} {how}")
                            recomputed.append((stream, used))
                            ck[stream] += (token[item.name],)
                            if stream in free:
                                moved_by.setdefault(stream, free[stream])
                return False

            if not early or stop_at is not None:
                step["recomputing"] += 1
                step["pass"] += 1
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
            for region in unpack_order(program, effects.nested_frames):
                recompute(region, snaps[id(region)])
        if reached is not None and any(name not in rerun_sites for name in ck_fwd if name in checkpointed):
            # A drawing site no recompute reruns: the recompute-mask oracle says "never recomputed"
            # (not of a site in a SAVE region, which it allows to be kept).
            fail(("recompute-mask",), effects.invisible_index)
        if graphs:
            _graph_replays(case, effects, forward_increment, dict(ck), dict(ref), ck_fwd, recomputed,
                           moved_by, keys, fail, notes)
            break
        for stream in keys:
            if ck[stream] != ref[stream]:
                fail(("live-stream",), moved_by.get(stream, -1))
    for index, note in notes.items():
        effects.why.setdefault(index, []).append(note)
    return causes


def _skip_save_body(site: Site, save_skip: tuple[frozenset[str], int], keys: set[str], key: dict[str, str],
                    ck: State, at_exit: State, shift: dict[str, int], shifted_by: dict[str, str]) -> None:
    """A site of a SAVE region's body in a recompute (`skips-save-regions`): not rerun, so it draws
    nothing; the impl's hooks put back the streams they restore (``restored``) where the forward
    left them at the body's exit.  A stream the body drew from that they do not put back stays
    behind, and every later draw of it in this recompute shifts: the entry is the cause."""
    restored, index = save_skip
    for stream in restored & keys:
        ck[stream] = at_exit[stream]
    stream = key[site.name]
    if draws(site) and stream not in restored:
        shift.setdefault(stream, index)
        shifted_by.setdefault(stream, f"the SAVE region's body {site.name} kept its draw, not rerun, and no hook "
                                      "put the stream back after it")


def _graph_replays(case: Case, effects: Effects, forward_increment: dict[str, tuple],
                   backward_increment: dict[str, tuple], reference_increment: dict[str, tuple],
                   forward_draws: dict[str, Any],
                   recomputed: Sequence[tuple[str, bool]], moved_by: dict[str, int], keys: set[str],
                   fail: Any, notes: dict[int, str]) -> None:
    """`host-rewind` under separate graphs: the replays of the forward graph, the interleaved
    draws' graph and the backward graph, iteration after iteration, per stream.

    A graph draws at its device base plus the offset its capture recorded (the capture pass of
    `replay` compared those offsets).  Up to torch 2.13 a stream's graphs share one device base,
    which a replay refills from the host offset only where the graph's increment is not empty;
    `per_capture`: each graph has its own, filled at every replay.  The host offset advances by
    each graph's increment.  A recompute draw fails where the backward graph's base is not the
    forward graph's, a forward draw where the forward graph's base is not the reference's (a
    backward graph left moved), a stream where its host offset ends elsewhere."""
    per_capture, index = effects.host_rewind
    between = case.interleave.value == "draws"
    code = case.streams()
    forward_streams = {_stream_key(code[name], case.device.value) for name in forward_draws}

    def bases(increments: Sequence[tuple]) -> list[tuple[Any, ...]]:
        """Per iteration, (the base each graph drew at, ..., the host offset at its end)."""
        host: tuple = ()
        shared: Any = ("captured",)  # what the device pair held before the first replay
        out = []
        for _ in range(case.program.iterations):
            seen = []
            for increment in increments:
                if per_capture or increment:
                    shared = host
                seen.append(shared)
                host += increment
            out.append((*seen, host))
        return out

    for stream in sorted(keys):
        graphs = [forward_increment.get(stream, ()), backward_increment.get(stream, ())]
        if between:
            graphs.insert(1, ("interleaved",))
        ck = bases(graphs)
        ref = bases([reference_increment.get(stream, ()), *graphs[1:-1], ()])
        if any(row[0] != row[-2] for row in ck):
            for drawn, used in recomputed:
                if drawn == stream:
                    fail(("recompute-mask", "gradient") if used else ("recompute-mask",), index)
                    notes.setdefault(index, f"the backward graph's recompute draws {stream} from another device "
                                            "base than the forward graph's: its rewind is capture-relative")
        cause = moved_by.get(stream, index)
        if stream in forward_streams and any(a[0] != b[0] for a, b in zip(ck, ref)):
            fail(("forward-mask", "output", "gradient"), cause)
        if any(a[-1] != b[-1] for a, b in zip(ck, ref)):
            fail(("live-stream",), cause)
            notes.setdefault(cause, f"the backward graph's capture leaves {stream} moved: every replay advances "
                                    "it further than the reference's")


def _read_later(region: Region, site: Any) -> bool:
    """Whether a site of `region` itself (one of its direct items) reads what `site` (a site of an
    inner region, at any depth) produced: one in a later reading group than the item of `region`
    that holds `site` (a group's items read one tensor side by side, and the next group reads their
    sum: `workload._sequence`; the sum saves nothing)."""
    groups = list(reading_groups(region.items))
    for number, group in enumerate(groups):
        if any(member is site or (isinstance(member, Region) and any(s is site for s in member.sites()))
               for member in group):
            return any(not isinstance(later, Region) for after in groups[number + 1:] for later in after)
    return False
