"""`torch-compile` and `torch-compile-budget`: checkpointing decided inside ``torch.compile``.

Both run the case's whole program as one graph (``torch.compile(fullgraph=True)``, inductor), and
the runner judges them against the same program compiled the same way without recompute
(`harness.run.compiled`: compiled RNG is not eager RNG):

* ``torch-compile``: ``torch.utils.checkpoint.checkpoint(use_reentrant=...)`` around every region,
  traced by dynamo (the ``tag_activation_checkpoint`` higher-order op); both modes.
* ``torch-compile-budget``: no checkpoint call at all; the compiler decides what to recompute,
  with ``torch._functorch.config.activation_memory_budget`` below 1.0 (`BUDGET`) for the
  checkpointed run and 1.0 (save everything) for the reference.  RNG ops must never be recomputed
  there; pytorch/pytorch#190717 and #190758 report that below 1.0 the partitioner recomputes
  dropout with fresh randomness (seen here on torch 2.11 CUDA and 2.13 CPU).  The mode axis does
  not apply (nothing is checkpointed by a call): reentrant cells are declared unsupported, the
  nonreentrant ones stand for it.

Declared unsupported for both: tracked, mixed and shared layouts (a tracker fork swaps generator
states in Python, which one graph cannot trace), CUDA-graph capture (compiled code under capture
is ``mode="reduce-overhead"``, which these adapters do not model), and attention sites (their
CUDA backward is not bit-reproducible, and one compiled reference per case is what is affordable).
Every case is unsupported where this torch lacks ``torch.compile`` or the budget knob.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..model.cases import Capture, Case, Layout, Mode
from ..model.programs import SDPA_OPS
from .base import Adapter

BUDGET = 0.5  # any value below 1.0 lets the partitioner trade memory for recompute


class CompiledCheckpointAdapter(Adapter):
    """``torch.utils.checkpoint`` inside ``torch.compile(fullgraph=True)``."""

    name = "torch-compile"
    description = "torch.compile(fullgraph=True) of the program with torch.utils.checkpoint around each region"
    compiled = True  # the runner compiles the program through this adapter (harness.run.compiled)

    @property
    def version(self) -> str | None:
        return torch.__version__

    def unavailable(self) -> str | None:
        """None where this torch has ``torch.compile``, else why not."""
        return None if hasattr(torch, "compile") else "this torch has no torch.compile"

    def supports(self, case: Case) -> str | None:
        """None for eager cases of the default and untracked layouts without attention sites."""
        reason = self.unavailable()
        if reason:
            return reason
        if case.layout not in (Layout.DEFAULT, Layout.UNTRACKED):
            return ("a tracker fork swaps generator states in Python, which one compiled graph "
                    "(fullgraph=True) cannot trace")
        if case.capture is not Capture.EAGER:
            return "CUDA-graph capture of compiled code (mode='reduce-overhead') is not modelled"
        if case.program.ops() & frozenset(SDPA_OPS):
            return "attention sites are not run compiled (a CUDA attention backward is not bit-reproducible)"
        return None

    def compiling(self, recompute: bool) -> contextlib.AbstractContextManager:
        """The compiler configuration of one run (the reference: ``recompute`` False)."""
        return contextlib.nullcontext()

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` compiled as one graph: a graph break is an error, never a silent eager fallback."""
        return torch.compile(fn, fullgraph=True)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=reentrant, **kwargs)


class BudgetAdapter(CompiledCheckpointAdapter):
    """No checkpoint call: the compiler recomputes what ``activation_memory_budget`` lets it."""

    name = "torch-compile-budget"
    description = (f"torch.compile(fullgraph=True) with torch._functorch.config.activation_memory_budget="
                   f"{BUDGET} (the compiler picks what to recompute)")

    def __init__(self, budget: float = BUDGET) -> None:
        self.budget = budget

    @staticmethod
    def _config() -> Any:
        import torch._functorch.config as functorch_config

        return functorch_config

    def unavailable(self) -> str | None:
        reason = super().unavailable()
        if reason is None and not hasattr(self._config(), "activation_memory_budget"):
            reason = "this torch has no torch._functorch.config.activation_memory_budget"
        return reason

    def supports(self, case: Case) -> str | None:
        reason = super().supports(case)
        if reason is None and case.mode is Mode.REENTRANT:
            reason = ("no checkpoint call (the compiler decides what to recompute): the mode axis does not "
                      "apply, the nonreentrant cells stand for it")
        return reason

    def compiling(self, recompute: bool) -> contextlib.AbstractContextManager:
        return self._config().patch(activation_memory_budget=self.budget if recompute else 1.0)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)  # no explicit checkpoint: the budget is the whole impl


def make_compiled() -> Adapter:
    return CompiledCheckpointAdapter()


def make_budget() -> Adapter:
    return BudgetAdapter()
