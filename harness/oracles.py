"""The five oracles of a case (DESIGN section 4), applied to a reference and a checkpointed run."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .compare import Mismatch, any_differences, bitwise_diff
from .streams import StreamSnapshot, compare_streams
from .workload import FORWARD, RECOMPUTE, MaskLog

ORACLES = ("forward-mask", "recompute-mask", "gradient", "live-stream", "fresh-randomness")


@dataclass
class RunRecord:
    """What one run (reference or checkpointed) left behind, per iteration."""

    log: MaskLog
    grads: dict[int, dict[str, torch.Tensor | None]] = field(default_factory=dict)
    streams: dict[int, StreamSnapshot] = field(default_factory=dict)

    def draws(self, iteration: int, site: str, phase: str) -> list[torch.Tensor]:
        return self.log.masks.get((iteration, site, phase), [])


class Checks:
    """Comparisons of one case, resolved together: one device sync per device, not one per pair.

    `compare` queues a bitwise comparison that yields a `Mismatch` when the pair differs; `differ`
    queues one that yields its `Mismatch` when the pair is equal; `add` files a ready one.  Details
    (count, first index, values) are computed only for the pairs that turn out to mismatch.
    `resolve` keeps the order in which the checks were made.
    """

    def __init__(self) -> None:
        self._items: list[tuple] = []

    def add(self, mismatch: Mismatch) -> None:
        self._items.append(("ready", mismatch))

    def compare(self, got: torch.Tensor, expected: torch.Tensor, oracle: str, subject: str, it: int) -> None:
        self._items.append(("compare", got, expected, oracle, subject, it))

    def differ(self, a: torch.Tensor, b: torch.Tensor, if_equal: Mismatch) -> None:
        self._items.append(("differ", a, b, if_equal))

    def resolve(self) -> list[Mismatch]:
        pairs = [(item[1], item[2]) for item in self._items if item[0] != "ready"]
        flags = iter(any_differences(pairs))
        out: list[Mismatch] = []
        for item in self._items:
            if item[0] == "ready":
                out.append(item[1])
            elif item[0] == "compare":
                if next(flags):
                    _, got, expected, oracle, subject, it = item
                    diff = bitwise_diff(got, expected, oracle=oracle, subject=subject, iteration=it)
                    out.extend([diff] if diff else [])
            elif not next(flags):
                out.append(item[3])
        return out


def _count_mismatch(oracle: str, site: str, it: int, got: int, expected: int, what: str) -> Mismatch:
    return Mismatch(oracle, site, it, 0, 0, detail=f"{got} {what}, expected {expected}")


def forward_masks(ref: RunRecord, ck: RunRecord, sites: list[str], it: int, checks: Checks) -> None:
    """Oracle 1: each site's checkpointed forward mask equals the reference's."""
    for site in sites:
        got, expected = ck.draws(it, site, FORWARD), ref.draws(it, site, FORWARD)
        if len(got) != len(expected):
            checks.add(_count_mismatch("forward-mask", site, it, len(got), len(expected), "forward draws"))
            continue
        for g, e in zip(got, expected):
            checks.compare(g, e, "forward-mask", site, it)


def recompute_masks(ck: RunRecord, sites: list[str], it: int, checks: Checks) -> None:
    """Oracle 2: every recompute of a checkpointed site redraws its forward mask exactly."""
    for site in sites:
        forward, recomputes = ck.draws(it, site, FORWARD), ck.draws(it, site, RECOMPUTE)
        if not recomputes:
            checks.add(Mismatch("recompute-mask", site, it, 0, 0, detail="the site was never recomputed"))
            continue
        if len(forward) != 1:
            continue  # already reported by the forward-mask oracle
        for n, mask in enumerate(recomputes, start=1):
            subject = site if len(recomputes) == 1 else f"{site} (recompute {n} of {len(recomputes)})"
            checks.compare(mask, forward[0], "recompute-mask", subject, it)


def gradients(ref: RunRecord, ck: RunRecord, it: int, checks: Checks) -> None:
    """Oracle 3: input and parameter gradients equal the reference's, bit for bit."""
    for name, expected in ref.grads[it].items():
        got = ck.grads[it].get(name)
        if expected is None or got is None:
            if (got is None) != (expected is None):
                missing = "checkpointed run" if got is None else "reference run"
                checks.add(Mismatch("gradient", name, it, 0, 0, detail=f"no gradient in the {missing}"))
            continue
        checks.compare(got, expected, "gradient", name, it)


def live_streams(ref: RunRecord, ck: RunRecord, it: int, checks: Checks) -> None:
    """Oracle 4: after backward every live stream (and alias) equals the reference's."""
    for mismatch in compare_streams(ck.streams[it], ref.streams[it], it):  # small CPU tensors
        checks.add(mismatch)


def fresh_randomness(ck: RunRecord, sites: list[str], iterations: int, checks: Checks) -> None:
    """Oracle 5: a site's forward mask differs from its mask in the previous iteration."""
    for it in range(1, iterations):
        for site in sites:
            now, before = ck.draws(it, site, FORWARD), ck.draws(it - 1, site, FORWARD)
            if now and before:
                checks.differ(now[0], before[0], Mismatch(
                    "fresh-randomness", site, it, 0, 0,
                    detail=f"forward mask is identical to iteration {it - 1}'s (stale RNG)",
                ))


def check(ref: RunRecord, ck: RunRecord, sites: list[str], iterations: int) -> list[Mismatch]:
    """Every oracle over every iteration, in oracle order within each iteration."""
    checks = Checks()
    for it in range(iterations):
        forward_masks(ref, ck, sites, it, checks)
        recompute_masks(ck, sites, it, checks)
        gradients(ref, ck, it, checks)
        live_streams(ref, ck, it, checks)
    fresh_randomness(ck, sites, iterations, checks)
    return checks.resolve()
