"""The oracles of a case, applied to a reference and a checkpointed run.

forward-mask, recompute-mask, gradient, buffer (module state such as running statistics),
live-stream, fresh-randomness, output (every region's output and the loss equal the reference's),
identity (every stream name resolves to the object it resolved to before the run) and ambient
(the process state a checkpoint touches besides RNG, `harness.run.ambient`, equals the reference's
after each top-level region's forward, after its backward and after the whole backward).  Each works
on `RunRecord`s alone, so tests can feed it synthetic records (tests/test_oracles.py).

Two oracles judge the checkpointed run by what the reference did, not by an absolute rule: a
site need only be recomputed in an iteration where the reference drew it (a layer that skips
itself at random, as layer drop does, draws nothing in some iterations; callers pass the sites
per iteration), and a forward mask that repeats its previous iteration's is not stale RNG where
the reference's repeated too and a repeat is likely by chance (`compare.repeat_chance`: a 0/1
mask of a few elements, such as drop-path's per-sample mask at batch 4).  A large mask that
repeats in both runs is still stale: a CUDA graph that replays a tracker stream it never
registered makes the reference stale too, and that is the impl's tracker's bug.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import torch

from ..results import ORACLES
from .ambient import differences as ambient_differences
from .compare import CHANCE_OF_REPEAT, Mismatch, any_differences, bitwise_diff, repeat_chance
from .records import CAPTURE, FORWARD, RECOMPUTE, WARMUP, RunRecord
from .streams import compare_streams, identity_mismatches

__all__ = ["ORACLES", "Checks", "RunRecord", "Sites", "check"]

# The checkpointed sites of a run: the same names in every iteration, or iteration -> names (a
# model whose draws depend on the iteration, such as layer drop).
Sites = Union[Sequence[str], Callable[[int], Sequence[str]]]


class Checks:
    """Comparisons of one case, resolved together: one device sync per device, not one per pair.

    `compare` queues a bitwise comparison that yields a `Mismatch` when the pair differs; `differ`
    queues one that yields its `Mismatch` when the pair is equal, unless `unless_chance` (the
    reference's pair) is equal too and such a repeat is likely by chance (`repeat_chance`);
    `add` files a ready one.  Details
    (count, first index, values) are computed only for the pairs that turn out to mismatch.
    `resolve` keeps the order in which the checks were made.
    """

    def __init__(self) -> None:
        self._items: list[tuple] = []

    def add(self, mismatch: Mismatch) -> None:
        self._items.append(("ready", mismatch))

    def compare(self, got: torch.Tensor, expected: torch.Tensor, oracle: str, subject: str, it: int) -> None:
        self._items.append(("compare", got, expected, oracle, subject, it))

    def differ(self, a: torch.Tensor, b: torch.Tensor, if_equal: Mismatch,
               unless_chance: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self._items.append(("differ", a, b, if_equal, unless_chance))

    def resolve(self) -> list[Mismatch]:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for item in self._items:
            if item[0] == "compare":
                pairs.append((item[1], item[2]))
            elif item[0] == "differ":
                pairs += [(item[1], item[2])] + ([item[4]] if item[4] is not None else [])
        flags = iter(any_differences(pairs))  # in the order the pairs were queued
        out: list[Mismatch] = []
        for item in self._items:
            if item[0] == "ready":
                out.append(item[1])
            elif item[0] == "compare":
                if next(flags):
                    _, got, expected, oracle, subject, it = item
                    diff = bitwise_diff(got, expected, oracle=oracle, subject=subject, iteration=it)
                    out.extend([diff] if diff else [])
            else:
                equal = not next(flags)
                ref_equal = item[4] is not None and not next(flags)
                # Only for a repeat in both runs is the mask read (rare: its value costs a sync).
                chance = equal and ref_equal and repeat_chance(item[1], item[2]) >= CHANCE_OF_REPEAT
                if equal and not chance:
                    out.append(item[3])
        return out


def _count_mismatch(oracle: str, site: str, it: int, got: int, expected: int, what: str) -> Mismatch:
    return Mismatch(oracle, site, it, 0, 0, detail=f"{got} {what}, expected {expected}")


def _same_records(oracle: str, ref: RunRecord, ck: RunRecord, names: list[str], it: int,
                  checks: Checks, what: str) -> None:
    """For each name, the checkpointed run's forward records equal the reference's: the same
    count (a missing or an extra name is a count of 0), then bit for bit, in order."""
    for name in names:
        got, expected = ck.draws(it, name, FORWARD), ref.draws(it, name, FORWARD)
        if len(got) != len(expected):
            checks.add(_count_mismatch(oracle, name, it, len(got), len(expected), what))
            continue
        for g, e in zip(got, expected):
            checks.compare(g, e, oracle, name, it)


def forward_masks(ref: RunRecord, ck: RunRecord, sites: list[str], it: int, checks: Checks,
                  output_names: Sequence[str] = ()) -> None:
    """Oracle 1: each site's checkpointed forward mask equals the reference's.  Every recorded
    name that is not an output counts as a site, so a site drawn in only one of the runs (missing,
    or extra) is a count mismatch."""
    recorded = [*sites, *ref.names(it, FORWARD), *ck.names(it, FORWARD)]
    names = [n for n in dict.fromkeys(recorded) if n not in output_names]
    _same_records("forward-mask", ref, ck, names, it, checks, "forward draws")


def outputs(ref: RunRecord, ck: RunRecord, names: list[str], it: int, checks: Checks) -> None:
    """Oracle 6: every region's output (as its caller got it) and the loss equal the reference's."""
    _same_records("output", ref, ck, names, it, checks, "outputs")


def recompute_masks(ck: RunRecord, sites: list[str], it: int, checks: Checks,
                    output_names: Sequence[str] = ()) -> None:
    """Oracle 2: every recompute of a checkpointed site redraws its forward draws exactly, in
    order (a site drawn k times per forward is recomputed in runs of k); a site never recomputed,
    or drawn in a recompute but never in the forward, is a failure too."""
    for site in sites:
        forward, recomputes = ck.draws(it, site, FORWARD), ck.draws(it, site, RECOMPUTE)
        if not recomputes:
            if ck.saved(it, site):
                continue  # drawn in a region the checkpoint saves (a SAVE region): not rerun by design
            checks.add(Mismatch("recompute-mask", site, it, 0, 0, detail="the site was never recomputed"))
            continue
        if not forward:
            continue  # reported by the forward-mask oracle (a count mismatch)
        for n, mask in enumerate(recomputes, start=1):
            subject = site if len(recomputes) == 1 else f"{site} (recompute {n} of {len(recomputes)})"
            checks.compare(mask, forward[(n - 1) % len(forward)], "recompute-mask", subject, it)
    for name in ck.names(it, RECOMPUTE):
        if name not in sites and name not in output_names and not ck.draws(it, name, FORWARD):
            checks.add(Mismatch("recompute-mask", name, it, 0, 0,
                                detail="drawn in a recompute but never in the forward"))


def _same_tensors(oracle: str, what: str, got_by_name: dict[str, torch.Tensor | None],
                  expected_by_name: dict[str, torch.Tensor | None], it: int, checks: Checks) -> None:
    """The two runs have the same names (key sets compared, as `assert_close` does for mappings)
    and, name by name, the same bits (None only where the other is None too)."""
    for name in [*expected_by_name, *(k for k in got_by_name if k not in expected_by_name)]:
        if name not in got_by_name or name not in expected_by_name:
            where = "checkpointed run" if name not in got_by_name else "reference run"
            checks.add(Mismatch(oracle, name, it, 0, 0, detail=f"no such {what} in the {where}"))
            continue
        got, expected = got_by_name[name], expected_by_name[name]
        if expected is None or got is None:
            if (got is None) != (expected is None):
                missing = "checkpointed run" if got is None else "reference run"
                checks.add(Mismatch(oracle, name, it, 0, 0, detail=f"no {what} in the {missing}"))
            continue
        checks.compare(got, expected, oracle, name, it)


def gradients(ref: RunRecord, ck: RunRecord, it: int, checks: Checks) -> None:
    """Oracle 3: input and parameter gradients equal the reference's, bit for bit; the two runs
    have the same gradient names."""
    _same_tensors("gradient", "gradient", ck.grads.get(it, {}), ref.grads.get(it, {}), it, checks)


def buffers(ref: RunRecord, ck: RunRecord, it: int, checks: Checks) -> None:
    """After backward every buffer of the model (running statistics, counters) equals the
    reference's, bit for bit: a recompute must not update module state a second time."""
    _same_tensors("buffer", "buffer", ck.buffers.get(it, {}), ref.buffers.get(it, {}), it, checks)


def live_streams(ref: RunRecord, ck: RunRecord, it: int, checks: Checks) -> None:
    """Oracle 4: after backward every live stream (and alias) equals the reference's."""
    got, expected = ck.streams.get(it), ref.streams.get(it)
    if got is None or expected is None:
        where = "checkpointed run" if got is None else "reference run"
        checks.add(Mismatch("live-stream", "every stream", it, 0, 0, detail=f"no snapshot in the {where}"))
        return
    for mismatch in compare_streams(got, expected, it):  # small CPU tensors
        checks.add(mismatch)


def fresh_randomness(ref: RunRecord, ck: RunRecord, sites: list[str], iterations: int, checks: Checks) -> None:
    """Oracle 5: a site's forward mask differs from its mask in the previous iteration, wherever
    the reference's did: a small 0/1 mask that the reference repeated too (a per-sample mask of a
    small batch repeats by chance) is no sign of stale RNG (`Checks.differ`)."""
    for it in range(1, iterations):
        for site in sites:
            now, before = ck.draws(it, site, FORWARD), ck.draws(it - 1, site, FORWARD)
            ref_now, ref_before = ref.draws(it, site, FORWARD), ref.draws(it - 1, site, FORWARD)
            if now and before:
                # Without the reference's pair (a count mismatch, reported by forward-mask) the
                # mask is judged on its own.
                reference_pair = (ref_now[0], ref_before[0]) if ref_now and ref_before else None
                checks.differ(now[0], before[0], Mismatch(
                    "fresh-randomness", site, it, 0, 0,
                    detail=f"forward mask is identical to iteration {it - 1}'s (stale RNG)",
                ), unless_chance=reference_pair)


def identity(ck: RunRecord, it: int, checks: Checks) -> None:
    """Oracle 7: after backward every tracker stream name resolves to its object from before the run."""
    for mismatch in identity_mismatches(ck.objects_before, ck.objects.get(it, {}), it):
        checks.add(mismatch)


PHASE_OF = {WARMUP: " (eager warm-up)", CAPTURE: " (during capture)"}


def ambient_state(ref: RunRecord, ck: RunRecord, checks: Checks) -> None:
    """Oracle 8: at each point where both runs read their ambient state, the checkpointed run's
    equals the reference's, piece by piece; a piece is reported where it first differs in an
    iteration (a leak persists: the later points would only repeat it).  A point one run never
    reached (no gradient reached a region's input) is the gradient oracle's to report.  Runs that
    read none (module mode) pass."""
    for it in sorted(set(ref.ambient) | set(ck.ambient), key=lambda i: (i >= 0, i)):
        expected_at: dict[str, list[dict]] = {}
        for label, state in ref.ambient.get(it, []):
            expected_at.setdefault(label, []).append(state)
        seen: dict[str, int] = {}
        reported: set[str] = set()
        for label, state in ck.ambient.get(it, []):
            n = seen[label] = seen.get(label, -1) + 1
            if n >= len(expected_at.get(label, [])):
                continue
            lines = {name: line for name, line in ambient_differences(state, expected_at[label][n]).items()
                     if name not in reported}
            if lines:
                reported.update(lines)
                checks.add(Mismatch("ambient", label + PHASE_OF.get(it, ""), max(it, 0), 0, 0,
                                    detail="; ".join(lines.values())))


def check(ref: RunRecord, ck: RunRecord, sites: Sites, iterations: int,
          output_names: list[str] | None = None, drawing: list[str] | None = None) -> list[Mismatch]:
    """Every oracle over every iteration, in oracle order within each iteration.  `sites` are the
    checkpointed sites (names, or a function of the iteration giving them); `output_names` the
    region and loss names the output oracle compares (default: none); `drawing` the sites whose op
    draws, which fresh-randomness checks (default: every site of every iteration)."""
    checks = Checks()
    sites_at = sites if callable(sites) else (lambda it: sites)
    for it in range(iterations):
        forward_masks(ref, ck, list(sites_at(it)), it, checks, output_names or [])
        recompute_masks(ck, list(sites_at(it)), it, checks, output_names or [])
        gradients(ref, ck, it, checks)
        buffers(ref, ck, it, checks)
        live_streams(ref, ck, it, checks)
        outputs(ref, ck, output_names or [], it, checks)
        identity(ck, it, checks)
    if drawing is None:
        drawing = list(dict.fromkeys(s for it in range(iterations) for s in sites_at(it)))
    fresh_randomness(ref, ck, drawing, iterations, checks)
    ambient_state(ref, ck, checks)
    return checks.resolve()
