"""Selective activation checkpointing (SAC): four policies, two of them as users write them.

``torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True, context_fn=...)``
with the contexts of ``torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)``, a fresh
policy for every checkpoint call (a policy that counts ops keeps its counts per region), eagerly:

* ``torch-sac-recompute``: the policy answers ``PREFER_RECOMPUTE`` for every op, so SAC's
  dispatch modes are in the path but everything is recomputed (it should judge like ``torch``'s
  non-reentrant checkpoint);
* ``torch-sac-save-rng``: ``MUST_SAVE`` for every op tagged ``nondeterministic_seeded`` (the RNG
  ops), ``PREFER_RECOMPUTE`` for the rest: the recompute gets the forward's random outputs back from
  SAC's cache instead of drawing, so no stream needs rewinding at all;
* ``torch-sac-titan``: torchtitan's op-level SAC policy (``_op_sac_save_list`` of
  ``torchtitan/models/llama3/parallelize.py`` and ``_custom_policy`` of
  ``torchtitan/distributed/activation_checkpoint.py``): ``MUST_SAVE`` for matmuls (all but every
  second ``mm``), the fused attention ops (efficient, flash, cuDNN, math, overrideable) and ``max``,
  ``PREFER_RECOMPUTE`` for the rest.  A saved attention op is not run in the recompute, so it does
  not advance the RNG stream: with attention dropout > 0 every RNG op after it in the region redraws
  from a shifted position (issue 24, findings/sac-save-list-rng-skew.md).  torchtitan itself wraps
  with ``preserve_rng_state=False`` by default (its models have no dropout); this impl keeps torch's
  default ``True``, the configuration under which a model with dropout has any chance;
* ``torch-sac-save-first-rng``: ``MUST_SAVE`` for the first RNG op of each region (in forward and in
  recompute alike), ``PREFER_RECOMPUTE`` for the rest: the same skew with no attention at all.

Reentrant mode is declared unsupported (``context_fn`` is for ``use_reentrant=False`` only; torch
raises ValueError), as is every case where this torch lacks ``create_selective_checkpoint_contexts``.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..checkpoint.stash import is_seeded
from ..model.cases import Case, Mode
from .base import Adapter
from .limits import Axis, Limit, declared, limit
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


# torchtitan's save list, by op name (looked up in torch.ops where this torch has the op).
TITAN_SAVE_LIST = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_to_all_single.default",
    "aten.max.default",
)


@functools.lru_cache(maxsize=None)
def titan_save_list() -> frozenset:
    """The ops of `TITAN_SAVE_LIST` this torch has (an op it lacks cannot be dispatched anyway)."""
    found = set()
    for path in TITAN_SAVE_LIST:
        obj: Any = torch.ops
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            continue
        found.add(obj)
    return frozenset(found)


def titan_policy() -> Callable[..., Any]:
    """A fresh torchtitan op-level policy: save what `titan_save_list` names, except every second
    ``mm`` of the region (counted separately in forward and recompute), recompute the rest."""
    counts: collections.Counter = collections.Counter()
    save, mm = titan_save_list(), torch.ops.aten.mm.default

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        key = "recompute" if ctx.is_recompute else "forward"
        if op == mm:
            counts[key] += 1
        to_save = op in save and not (op == mm and counts[key] % 2 == 0)
        checkpoint_policy = torch.utils.checkpoint.CheckpointPolicy
        return checkpoint_policy.MUST_SAVE if to_save else checkpoint_policy.PREFER_RECOMPUTE

    return policy


def save_first_rng_policy() -> Callable[..., Any]:
    """A fresh policy that must-saves the first RNG op of its region and recomputes the rest."""
    seen: collections.Counter = collections.Counter()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint_policy = torch.utils.checkpoint.CheckpointPolicy
        if not is_seeded(op):
            return checkpoint_policy.PREFER_RECOMPUTE
        key = "recompute" if ctx.is_recompute else "forward"
        seen[key] += 1
        return checkpoint_policy.MUST_SAVE if seen[key] == 1 else checkpoint_policy.PREFER_RECOMPUTE

    return policy


class SelectiveAdapter(TorchAdapter):
    """``torch``'s adapter (non-reentrant ``torch.utils.checkpoint``) with a selective-checkpoint
    policy's ``context_fn``; `make_policy` gives the policy of each checkpoint call (a new one
    where the policy counts ops, so the counts are per region)."""

    must_support_all = False  # a variant under test, not the reference impl torch is

    def __init__(self, name: str, make_policy: Callable[[], Callable[..., Any]], description: str) -> None:
        self.name, self.make_policy, self.description = name, make_policy, description

    def unavailable(self) -> str | None:
        """None where this torch has selective activation checkpointing, else why not."""
        return None if _sac() else "this torch has no torch.utils.checkpoint.create_selective_checkpoint_contexts"

    def declared_limits(self) -> tuple[Limit, ...]:
        """No reentrant form."""
        return (limit(Axis.MODE, [Mode.REENTRANT], "selective checkpointing (context_fn) is for "
                      "use_reentrant=False only (torch raises ValueError)"),)

    def supports(self, case: Case) -> str | None:
        """None for non-reentrant cases (where SAC exists)."""
        return self.unavailable() or declared(self.declared_limits(), case)

    def options(self) -> dict[str, Any]:
        create, _ = _sac()  # type: ignore[misc]
        make_policy = self.make_policy
        return {"context_fn": lambda: create(make_policy())}


def make_sac_recompute() -> Adapter:
    return SelectiveAdapter("torch-sac-recompute", lambda: recompute_all,
                            "torch.utils.checkpoint with a selective policy that recomputes every op")


def make_sac_save_rng() -> Adapter:
    return SelectiveAdapter("torch-sac-save-rng", lambda: save_rng,
                            "torch.utils.checkpoint with a selective policy that must-saves RNG ops")


def make_sac_titan() -> Adapter:
    return SelectiveAdapter("torch-sac-titan", titan_policy,
                            "torch.utils.checkpoint with torchtitan's op-level SAC policy (matmuls and "
                            "fused attention saved, the rest recomputed)")


def make_sac_save_first_rng() -> Adapter:
    return SelectiveAdapter("torch-sac-save-first-rng", save_first_rng_policy,
                            "torch.utils.checkpoint with a selective policy that must-saves the first RNG "
                            "op of each region and recomputes the others")
