"""`torch-compile`, `torch-compile-budget`, `torch-region-budget*`: checkpointing inside ``torch.compile``.

The first two run the case's whole program as one graph (``torch.compile(fullgraph=True)``, inductor), and
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

``torch-region-budget`` and its three siblings (issue 39): torch's prototype *regional* budget,
``torch.autograd.graph.region_activation_memory_budget(b)`` (torch 2.13; found by ``hasattr``),
entered around each region of the program inside ``torch.compile(fullgraph=True)``, with no
checkpoint call; the reference is the same program compiled the same way without the annotation
(the global ``activation_memory_budget`` held at 1.0 in both runs).  Four names, one per budget and
backend:

==================================  ==============================  ======
name                                backend                         budget
==================================  ==============================  ======
``torch-region-budget``             ``aot_eager_decomp_partition``  0.5
``torch-region-budget-0``           ``aot_eager_decomp_partition``  0.0
``torch-region-budget-inductor``    ``inductor``                    0.5
``torch-region-budget-inductor-0``  ``inductor``                    0.0
==================================  ==============================  ======

(``aot_eager_decomp_partition`` runs the min-cut partitioner the budget steers, without inductor's
codegen: RNG ops run as eager kernels.)  The ops outside regions: torch 2.13 applies one budget per
joint graph, and rejects an annotation that does not cover every forward op ("must cover the entire
forward of a graph ...", raised at every budget, 1.0 included, before anything runs).  A user who
writes ``with region_activation_memory_budget(b): x = layer(x)`` around each layer of a
``fullgraph=True`` program, and computes the loss outside, gets that error in every program (the
loss's ``sum`` is unannotated), so the error's own advice is what a user does next: *wrap the whole
forward in a single region*.  These impls do both: the same budget around the whole compiled
forward (the sites between regions and the loss), when the program has a region, and around each
region inside it (nested annotations of one budget agree).  A graph break instead would contradict
``fullgraph=True`` and split the program into graphs of which the unannotated ones run at the
global budget.  Measured here (torch 2.13.0+cpu, `findings/torch-region-budget-rng.md`): with a
dropout in the region, ``aot_eager_decomp_partition`` recomputes it in backward with fresh
randomness at b = 0.5 and 0.0 (32801/65536 mask elements differ from the forward's in the
finding's 256x256 reproducer; at b = 1.0 it is exact); inductor fails to compile at every budget,
1.0 included, wherever the graph draws ("must cover the entire forward ... Unannotated ops:
['inductor_seeds_default']": inductor's RNG lowering adds a seeds op the annotation never covers).
torch 2.15 adds ``torch._functorch.config.activation_memory_budget_require_full_coverage`` (not in
2.13: not checked here).  Declared unsupported: as ``torch-compile-budget`` (tracked, mixed and
shared layouts, capture, attention sites; reentrant cells, the mode axis standing for nothing).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..model.cases import Capture, Case, Layout, Mode
from ..model.programs import SDPA_OPS
from .base import Adapter
from .limits import Axis, Limit, declared, limit

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

    def declared_limits(self) -> tuple[Limit, ...]:
        """Only the default and untracked layouts, only eagerly, no attention sites."""
        return (
            limit(Axis.LAYOUT, set(Layout) - {Layout.DEFAULT, Layout.UNTRACKED},
                  "a tracker fork swaps generator states in Python, which one compiled graph (fullgraph=True) "
                  "cannot trace"),
            limit(Axis.CAPTURE, set(Capture) - {Capture.EAGER},
                  "CUDA-graph capture of compiled code (mode='reduce-overhead') is not modelled"),
            limit(Axis.OP, SDPA_OPS, "attention sites are not run compiled (a CUDA attention backward is not "
                  "bit-reproducible)"),
        )

    def supports(self, case: Case) -> str | None:
        """None for eager cases of the default and untracked layouts without attention sites."""
        return self.unavailable() or declared(self.declared_limits(), case)

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

    def declared_limits(self) -> tuple[Limit, ...]:
        """As the compiled checkpoint's, and no reentrant mode: there is no checkpoint call."""
        return (*super().declared_limits(),
                limit(Axis.MODE, [Mode.REENTRANT], "no checkpoint call (the compiler decides what to recompute): "
                      "the mode axis does not apply, the nonreentrant cells stand for it"))

    def compiling(self, recompute: bool) -> contextlib.AbstractContextManager:
        return self._config().patch(activation_memory_budget=self.budget if recompute else 1.0)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)  # no explicit checkpoint: the budget is the whole impl


class RegionBudgetAdapter(BudgetAdapter):
    """No checkpoint call: ``region_activation_memory_budget(budget)`` around each region and
    around the whole compiled forward (module doc), on one ``backend``."""

    def __init__(self, budget: float, backend: str) -> None:
        super().__init__(budget)
        self.backend = backend
        self.annotating = False  # True while the checkpointed run compiles (`compiling`)
        suffix = ("" if backend == "aot_eager_decomp_partition" else f"-{backend}") + ("-0" if budget == 0 else "")
        self.name = f"torch-region-budget{suffix}"
        self.description = (f"torch.compile(fullgraph=True, backend={backend!r}) with "
                            f"torch.autograd.graph.region_activation_memory_budget({budget}) around each region "
                            "and the whole forward (reference: no annotation)")

    @staticmethod
    def _annotation() -> Any:
        return getattr(torch.autograd.graph, "region_activation_memory_budget", None)

    def unavailable(self) -> str | None:
        reason = CompiledCheckpointAdapter.unavailable(self)
        if reason is None and self._annotation() is None:
            reason = "this torch has no torch.autograd.graph.region_activation_memory_budget"
        if reason is None and not hasattr(self._config(), "activation_memory_budget"):
            reason = "this torch has no torch._functorch.config.activation_memory_budget"
        return reason

    @contextlib.contextmanager
    def compiling(self, recompute: bool) -> Any:
        """Both runs at the global budget 1.0 (save everything); only the checkpointed one annotated."""
        self.annotating = recompute
        try:
            with self._config().patch(activation_memory_budget=1.0):
                yield
        finally:
            self.annotating = False

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` (the program's forward) as one graph on this backend; in the checkpointed run, with
        a program that has a region, under one annotation of the budget as a whole (module doc)."""
        program = getattr(getattr(fn, "__self__", None), "program", None)
        if self.annotating and (program is None or program.regions()):
            annotation, budget, body = self._annotation(), self.budget, fn

            def fn(*args: Any, **kwargs: Any) -> Any:
                with annotation(budget):
                    return body(*args, **kwargs)

        return torch.compile(fn, fullgraph=True, backend=self.backend)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        with self._annotation()(self.budget):  # what a user writes around a layer
            return fn(*args, **kwargs)


def make_compiled() -> Adapter:
    return CompiledCheckpointAdapter()


def make_budget() -> Adapter:
    return BudgetAdapter()


def make_region_budget() -> Adapter:
    return RegionBudgetAdapter(0.5, "aot_eager_decomp_partition")


def make_region_budget_0() -> Adapter:
    return RegionBudgetAdapter(0.0, "aot_eager_decomp_partition")


def make_region_budget_inductor() -> Adapter:
    return RegionBudgetAdapter(0.5, "inductor")


def make_region_budget_inductor_0() -> Adapter:
    return RegionBudgetAdapter(0.0, "inductor")
