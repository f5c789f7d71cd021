"""Compiled checkpointing: a case's program run whole under ``torch.compile``.

An impl with ``compiled = True`` (`harness.impls.compiled`) gives the runner ``compile(fn)`` and
``compiling(recompute)`` (the compiler configuration of one run) besides ``checkpoint``.  Its
reference is not the eager program: compiled RNG is not eager RNG (inductor draws its own seeds),
so the reference is **the same program compiled the same way without recompute** (no checkpoint
call, ``compiling(recompute=False)``), and the checkpointed run is the program compiled with the
impl's checkpoint inside (``compiling(recompute=True)``).  Both start from the same RNG states.

Inside one compiled graph nothing can be recorded per site: a Python callback would break the
graph (and inside a checkpoint the compiler would fall back to eager), so what is compared is what
a compiled program hands out:

* ``output``: every top-level region's output and the loss, bit for bit;
* ``gradient``: input and parameter gradients, bit for bit;
* ``live-stream``: the CPU generator and every CUDA default generator after backward;
* and, for programs whose every drawing site is a dropout (whose zeros are its mask's zeros and
  carry through the multiplications that follow), the **dropout pattern** as a site of its own,
  ``pattern``: the zeros of the program's final activation are the union of the forward masks'
  zeros (``forward-mask pattern``: equal to the reference's; ``fresh-randomness``: they change
  between iterations), and the zeros of the input gradient are the union of the masks backward
  used (``recompute-mask pattern``: equal to the forward's zeros; a recompute that drew fresh
  masks makes them differ).  The reference must show equal patterns itself (checked before it is
  trusted), else the case is an error: the pattern could not stand for the masks there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from ..check.oracles import check
from ..check.records import FORWARD, LOSS, RECOMPUTE, MaskLog, RunRecord
from ..check.reference import ReferenceCheckError, _constant
from ..model import ops
from ..model.cases import Case
from ..model.programs import Region
from . import partition_watch
from .streams import preserved_global_rng, snapshot_streams
from .workload import CheckpointFn, Tensors, Workload, _entered, seed_all, torch_dtype

PATTERN = "pattern"  # the pseudo-site of the dropout pattern
PATTERN_OPS, MIXING_PASSINGS = ops.PATTERN_OPS, ops.MIXING_PASSINGS  # (the model layer's: models read them too)


def has_pattern(case: Case) -> bool:
    """True when the zeros of `case`'s final activation and input gradient are its dropout masks'
    zeros: every site a dropout (or a site that draws nothing), some site draws, no region mixes
    elements (`ops.has_pattern`)."""
    return ops.has_pattern(case.program)


class CompiledWorkload(Workload):
    """The case's program as one traceable function: no recording, no watching, no events inside
    (`program_forward` returns what the runner records)."""

    def _site(self, site: Any, h: torch.Tensor) -> torch.Tensor:
        dtype = torch_dtype(site.dtype)
        if h.dtype != dtype:
            h = h.to(dtype)
        with self._stream(site):
            out, _ = ops.REGISTRY[site.op].apply(h, site.own_backend)
        return out * self.weights[f"weight.{site.name}"]

    def _call(self, region: Region, h: torch.Tensor) -> torch.Tensor:
        fn, args, kwargs = _entered(self._body(region), region.passing, h)
        with self._context(region):
            return fn(*args, **kwargs) if self.checkpoint is None else self.checkpoint(fn, args, kwargs, h)

    def program_forward(self, x: torch.Tensor, loss_weight: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(loss, final activation, each top-level region's output) of one forward pass."""
        h, outs = x, []
        for item in self.program.items():
            if isinstance(item, Region):
                h = self._call(item, h)
                outs.append(h)
            else:
                h = self._site(item, h)
        loss = (h.to(loss_weight.dtype) * loss_weight).float().sum()
        return loss, h, tuple(outs)


def _run(case: Case, impl: Any, device: torch.device, tensors: Tensors, checkpoint: CheckpointFn | None,
         iterations: int, regions: list[str], pattern: bool, observed: "dict[str, Any] | None" = None) -> RunRecord:
    """One compiled run (the reference when `checkpoint` is None), recorded per iteration: the
    outputs of the top-level `regions`, the loss and, with `pattern`, the dropout pattern; with
    `observed`, what the compiler put in the backward graph (`partition_watch`) goes there."""
    torch._dynamo.reset()  # no compiled code, guard or recompile count carried over from another run
    seed_all()
    x, weights = tensors.fresh_leaves()
    record = RunRecord(MaskLog())
    workload = CompiledWorkload(case, device, None, weights, checkpoint, record=lambda name, value: None)
    watch = partition_watch.watching(observed) if observed is not None else contextlib.nullcontext()
    with impl.compiling(recompute=checkpoint is not None), watch:
        forward = impl.compile(workload.program_forward)
        for it in range(iterations):
            record.log.start(it)
            for leaf in (x, *weights.values()):
                leaf.grad = None
            loss, h, outs = forward(x, tensors.loss_weight)
            for name, out in zip(regions, outs):
                record.log.record(name, out)
            record.log.record(LOSS, loss)
            if pattern:
                record.log.record(PATTERN, h == 0)
            workload.interleaved_draws()
            record.log.phase = RECOMPUTE
            loss.backward()
            if pattern:
                record.log.record(PATTERN, x.grad == 0)
            record.grads[it] = {"input": x.grad.detach().clone() if x.grad is not None else None,
                                **{k: None if w.grad is None else w.grad.detach().clone() for k, w in weights.items()}}
            record.streams[it] = snapshot_streams(None)
    return record


def check_compiled_reference(record: RunRecord, iterations: int, impl: str) -> None:
    """`ReferenceCheckError` when the compiled reference's dropout pattern cannot stand for its
    masks: the input gradient's zeros differ from the final activation's, or the pattern is
    constant (nothing or everything dropped)."""
    for it in range(iterations):
        forward = record.log.masks.get((it, PATTERN, FORWARD), [])
        backward = record.log.masks.get((it, PATTERN, RECOMPUTE), [])
        if not forward or not backward:
            raise ReferenceCheckError(f"reference check failed for impl {impl!r}: no dropout pattern recorded "
                                      f"in iteration {it}")
        if bool(_constant(forward[0])):
            raise ReferenceCheckError(f"reference check failed for impl {impl!r}: the dropout pattern of "
                                      f"iteration {it} is constant (every element dropped or none)")
        if not torch.equal(forward[0], backward[0]):
            differ = int((forward[0] != backward[0]).sum())
            raise ReferenceCheckError(
                f"reference check failed for impl {impl!r}: without recompute the input gradient's zeros "
                f"differ from the output's in {differ} elements (iteration {it}), so the dropout pattern "
                "cannot stand for the masks in this program")


def run_compiled(case: Case, impl: Any, name: str, iterations: int,
                 checkpoint_with: Callable[[Any], CheckpointFn], observed: "dict[str, Any] | None" = None) -> list:
    """The mismatches of `case` under compiled impl `impl`: the compiled reference, its check, the
    compiled checkpointed run, then the oracles over what compiled code hands out (module doc).
    `observed` gets what the compiler put in the checkpointed run's backward graph."""
    device = torch.device(case.device.value)
    if device.type == "cuda":
        torch.cuda.init()
    regions = [item.name for item in case.program.items() if isinstance(item, Region)]
    pattern = has_pattern(case)
    with preserved_global_rng(), ops.determinism(case.program.ops()):
        tensors = Tensors.make(case, device)
        reference = _run(case, impl, device, tensors, None, iterations, regions, pattern)
        if pattern:
            check_compiled_reference(reference, iterations, name)
        checkpointed = _run(case, impl, device, tensors, checkpoint_with(None), iterations, regions, pattern,
                            observed)
        torch._dynamo.reset()
    sites = [PATTERN] if pattern else []
    return check(reference, checkpointed, sites, iterations, [*regions, LOSS], drawing=sites)
