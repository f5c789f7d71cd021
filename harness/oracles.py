"""The five oracles of a case (DESIGN section 4), applied to a reference and a checkpointed run."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .compare import Mismatch, bitwise_diff
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


def _count_mismatch(oracle: str, site: str, it: int, got: int, expected: int, what: str) -> Mismatch:
    return Mismatch(oracle, site, it, 0, 0, detail=f"{got} {what}, expected {expected}")


def forward_masks(ref: RunRecord, ck: RunRecord, sites: list[str], it: int) -> list[Mismatch]:
    """Oracle 1: each site's checkpointed forward mask equals the reference's."""
    out = []
    for site in sites:
        got, expected = ck.draws(it, site, FORWARD), ref.draws(it, site, FORWARD)
        if len(got) != len(expected):
            out.append(_count_mismatch("forward-mask", site, it, len(got), len(expected), "forward draws"))
            continue
        for g, e in zip(got, expected):
            diff = bitwise_diff(g, e, oracle="forward-mask", subject=site, iteration=it)
            out.extend([diff] if diff else [])
    return out


def recompute_masks(ck: RunRecord, sites: list[str], it: int) -> list[Mismatch]:
    """Oracle 2: every recompute of a checkpointed site redraws its forward mask exactly."""
    out = []
    for site in sites:
        forward, recomputes = ck.draws(it, site, FORWARD), ck.draws(it, site, RECOMPUTE)
        if not recomputes:
            out.append(Mismatch("recompute-mask", site, it, 0, 0, detail="the site was never recomputed"))
            continue
        if len(forward) != 1:
            continue  # already reported by the forward-mask oracle
        for n, mask in enumerate(recomputes, start=1):
            subject = site if len(recomputes) == 1 else f"{site} (recompute {n} of {len(recomputes)})"
            diff = bitwise_diff(mask, forward[0], oracle="recompute-mask", subject=subject, iteration=it)
            out.extend([diff] if diff else [])
    return out


def gradients(ref: RunRecord, ck: RunRecord, it: int) -> list[Mismatch]:
    """Oracle 3: input and parameter gradients equal the reference's, bit for bit."""
    out = []
    for name, expected in ref.grads[it].items():
        got = ck.grads[it].get(name)
        if expected is None or got is None:
            if (got is None) != (expected is None):
                missing = "checkpointed run" if got is None else "reference run"
                out.append(Mismatch("gradient", name, it, 0, 0, detail=f"no gradient in the {missing}"))
            continue
        diff = bitwise_diff(got, expected, oracle="gradient", subject=name, iteration=it)
        out.extend([diff] if diff else [])
    return out


def live_streams(ref: RunRecord, ck: RunRecord, it: int) -> list[Mismatch]:
    """Oracle 4: after backward every live stream (and alias) equals the reference's."""
    return compare_streams(ck.streams[it], ref.streams[it], it)


def fresh_randomness(ck: RunRecord, sites: list[str], iterations: int) -> list[Mismatch]:
    """Oracle 5: a site's forward mask differs from its mask in the previous iteration."""
    out = []
    for it in range(1, iterations):
        for site in sites:
            now, before = ck.draws(it, site, FORWARD), ck.draws(it - 1, site, FORWARD)
            if now and before and bitwise_diff(now[0], before[0], oracle="", subject="", iteration=it) is None:
                out.append(Mismatch(
                    "fresh-randomness", site, it, 0, 0,
                    detail=f"forward mask is identical to iteration {it - 1}'s (stale RNG)",
                ))
    return out


def check(ref: RunRecord, ck: RunRecord, sites: list[str], iterations: int) -> list[Mismatch]:
    """Every oracle over every iteration, in oracle order within each iteration."""
    out: list[Mismatch] = []
    for it in range(iterations):
        out += forward_masks(ref, ck, sites, it)
        out += recompute_masks(ck, sites, it)
        out += gradients(ref, ck, it)
        out += live_streams(ref, ck, it)
    out += fresh_randomness(ck, sites, iterations)
    return out
