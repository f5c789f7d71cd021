"""A torch_remat ``RecomputeStateHook`` for every live RNG stream (issue 38).

torch_remat (PyPI ``torch-remat``) runs torch's non-reentrant checkpoint with
``preserve_rng_state=False`` and restores randomness only through hooks its users write.  This is
the hook the harness ships for them, the RNG handling of the bundled checkpoint in the shape
torch_remat asks for::

    import torch_remat as remat
    from harness.checkpoint import RecomputeRNGHook

    hook = RecomputeRNGHook(tracker=my_tracker)  # tracker optional (Megatron-style streams)
    out = remat.checkpoint(region_name="layers.0", recompute_state_hooks=(hook,))(block)(x)

`snapshot` copies the **values** of every live generator (the CPU generator, every CUDA device's
default generator, each distinct stream of the tracker); `restore` writes them back into the same
generator objects, in place, so aliases and CUDA-graph registrations stay valid.  torch_remat calls
them at region entry and around each SAVE region, and itself forks the state around the recompute
(snapshot at its start, restore at its end), so after backward every stream is where a
non-checkpointed run leaves it.

Under CUDA-graph capture a host value is relative to the capturing graph: 'values' is right when
forward and recompute are captured in one graph only; 'philox' (torch >= 2.14,
``Generator.philox_state``) also carries the graph's device seed and base offset, right across
separate graphs.  'auto' is 'philox' where this torch has it, else 'values'.  (The bundled
checkpoint's 'stash' keeps a region's random outputs instead: a hook cannot.)

Cost: one value copy of each generator per snapshot (5056 bytes for the CPU's MT19937 state, 16 for
a CUDA generator's seed and offset), at region entry and after each SAVE region; `snapshot_bytes`
says how much one snapshot holds.
"""

from __future__ import annotations

from typing import Any

from .rng import ValuePolicy, resolve_capture_strategy

HOOK_STRATEGIES = ("auto", "values", "philox")


class RecomputeRNGHook:
    """A torch_remat ``RecomputeStateHook`` that snapshots and restores every live RNG stream by
    value (module docstring).  `tracker`: an RNG states tracker whose streams to include (an
    object with ``generators()``, as the harness's and Megatron-style views have), or None."""

    def __init__(self, tracker: Any = None, capture_strategy: str = "auto") -> None:
        if capture_strategy not in HOOK_STRATEGIES:
            raise ValueError(f"unknown capture_strategy {capture_strategy!r} for a hook; valid: "
                             f"{', '.join(HOOK_STRATEGIES)} (a hook cannot stash)")
        self.tracker = tracker
        self._policy = ValuePolicy()
        resolved = resolve_capture_strategy(capture_strategy)
        self._policy.capture_strategy = "values" if resolved == "stash" else resolved

    @property
    def capture_strategy(self) -> str:
        """'values' or 'philox': how a snapshot taken under capture is made."""
        return self._policy.capture_strategy

    def snapshot(self) -> Any:
        """Value copies of every live generator, now."""
        return self._policy.snapshot(self.tracker)

    def restore(self, state: Any) -> None:
        """Write a snapshot's values back into the same generator objects."""
        self._policy.rewind(state)

    def snapshot_bytes(self) -> int:
        """How many bytes one snapshot holds (the state values it copies)."""
        return sum(value.numel() * value.element_size() for _, value in self.snapshot().entries)
