"""The RNG timeline of `repro`: every stream's state at each step, reference beside checkpointed.

Steps: region entry and exit in forward, after the interleaved draws, region entry and exit in the
recompute, after backward.  A recompute step is held against the reference's forward step of the
same region (a recompute must start where the forward started and end where it ended); every
other step against the reference's same step.  The first step where a stream differs is marked.
Under CUDA-graph capture the region steps are read while capturing (iteration "capture", states
relative to the capture) and the after-backward steps after each replay; warm-up steps are left out.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import torch

from ..check.records import CAPTURE

Event = tuple[int, str, dict[str, torch.Tensor]]


def show_state(state: torch.Tensor) -> str:
    """A CUDA Philox state as 'offset N' (seed omitted: it never changes here); others hashed."""
    flat = state.reshape(-1)
    if flat.numel() == 16 and flat.dtype == torch.uint8:
        seed, offset = flat.view(torch.int64).tolist()
        return f"offset {offset}"
    return "#" + hashlib.sha1(flat.numpy().tobytes()).hexdigest()[:8]


def _expected_label(label: str) -> str:
    return label.replace("recompute ", "forward ", 1) if label.startswith("recompute ") else label


def rows(reference: list[Event], checkpointed: list[Event]) -> list[dict[str, Any]]:
    """Table rows (iteration, step, stream, reference, checkpointed, mark) in checkpointed order."""
    ref_index: dict[tuple[int, str, int], dict[str, torch.Tensor]] = {}
    seen: Counter = Counter()
    for it, label, states in reference:
        ref_index[(it, label, seen[(it, label)])] = states
        seen[(it, label)] += 1
    out, seen, diverged = [], Counter(), False
    for it, label, states in checkpointed:
        want = _expected_label(label)
        key = (it, want)
        # a recompute step is held against the first forward occurrence of its region
        occurrence = 0 if want != label else seen[key]
        seen[key] += want == label
        expected = ref_index.get((it, want, occurrence), {})
        for stream, state in states.items():
            ref_state = expected.get(stream)
            same = ref_state is not None and torch.equal(ref_state, state)
            mark = ""
            if ref_state is not None and not same and not diverged:
                mark, diverged = "<-- first divergence", True
            elif ref_state is not None and not same:
                mark = "differs"
            out.append({
                "iteration": "capture" if it == CAPTURE else it, "step": label, "stream": stream,
                "reference": show_state(ref_state) if ref_state is not None else "-",
                "checkpointed": show_state(state), "": mark,
            })
    return out


def render(reference: list[Event], checkpointed: list[Event], streams: list[str] | None = None) -> str:
    """The timeline as a plain-text table (tabulate), optionally only for some streams."""
    from tabulate import tabulate

    table = [r for r in rows(reference, checkpointed) if streams is None or r["stream"] in streams]
    return tabulate(table, headers="keys", tablefmt="simple")
