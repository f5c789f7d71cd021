"""`torch-sac-recompute` and `torch-sac-save-rng`: selective activation checkpointing (SAC).

``torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=...)`` with the contexts of
``torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)``, eagerly:

* ``torch-sac-recompute``: the policy answers ``PREFER_RECOMPUTE`` for every op, so SAC's
  dispatch modes are in the path but everything is recomputed (it should judge like ``torch``'s
  non-reentrant checkpoint);
* ``torch-sac-save-rng``: ``MUST_SAVE`` for every op tagged ``nondeterministic_seeded`` (the RNG
  ops), ``PREFER_RECOMPUTE`` for the rest: the recompute gets the forward's random outputs back from
  SAC's cache instead of drawing, so no stream needs rewinding at all.

Reentrant mode is declared unsupported (``context_fn`` is for ``use_reentrant=False`` only; torch
raises ValueError), as is every case where this torch lacks ``create_selective_checkpoint_contexts``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..cases import Case, Mode
from ..checkpoint.stash import is_seeded
from .base import Adapter
from .torch_checkpoint import TorchAdapter


def _sac() -> tuple[Any, Any] | None:
    """(create_selective_checkpoint_contexts, CheckpointPolicy), or None on a torch without SAC."""
    create = getattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts", None)
    policy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)
    return (create, policy) if create is not None and policy is not None else None


def recompute_all(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Recompute every op."""
    return torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def save_rng(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Keep the output of every RNG op (tagged ``nondeterministic_seeded``); recompute the rest."""
    policy = torch.utils.checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if is_seeded(op) else policy.PREFER_RECOMPUTE


class SelectiveAdapter(TorchAdapter):
    """``torch``'s adapter (non-reentrant ``torch.utils.checkpoint``) with a selective-checkpoint
    policy's ``context_fn``."""

    must_support_all = False  # a variant under test, not the reference impl torch is

    def __init__(self, name: str, policy: Callable[..., Any], description: str) -> None:
        self.name, self.policy, self.description = name, policy, description

    def unavailable(self) -> str | None:
        """None where this torch has selective activation checkpointing, else why not."""
        return None if _sac() else "this torch has no torch.utils.checkpoint.create_selective_checkpoint_contexts"

    def supports(self, case: Case) -> str | None:
        """None for non-reentrant cases (where SAC exists)."""
        reason = self.unavailable()
        if reason is None and case.mode is Mode.REENTRANT:
            reason = "selective checkpointing (context_fn) is for use_reentrant=False only (torch raises ValueError)"
        return reason

    def options(self) -> dict[str, Any]:
        create, _ = _sac()  # type: ignore[misc]
        return {"context_fn": functools.partial(create, self.policy)}


def make_sac_recompute() -> Adapter:
    return SelectiveAdapter("torch-sac-recompute", recompute_all,
                            "torch.utils.checkpoint with a selective policy that recomputes every op")


def make_sac_save_rng() -> Adapter:
    return SelectiveAdapter("torch-sac-save-rng", save_rng,
                            "torch.utils.checkpoint with a selective policy that must-saves RNG ops")
