"""The draw log of module mode, and what it reads back.

`DrawLog` records every RNG op a model runs (tagged ``nondeterministic_seeded``), in forward and
in recompute, under ``PATH (aten::op)``: the submodule path running it and the op, by what it drew
(`rng_output`).  `first_divergent_draw` names the first draw the oracles found wrong, in the
order the run drew; where none is, `diagnose` says what differs instead (rounding, other values,
module state) without changing the outcome.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..check.compare import Mismatch, scaled_difference
from ..check.records import FORWARD, MaskLog, RunRecord
from ..checkpoint.stash import is_seeded
from ..impls.remat import drawing_in_save_region

# Outputs of a seeded op that identify its draw exactly: the Philox seed and offset that fused
# attention kernels return (their dropout is drawn inside the kernel).
_RNG_RETURNS = ("philox_seed", "philox_offset", "rng_state")


def rng_output(func: Any, out: Any) -> torch.Tensor | None:
    """The part of a seeded op's output that is its draw: the Philox seed and offset where the
    op returns them (fused attention), else its boolean mask where it returns one (dropout's),
    else its first tensor output (rand, bernoulli_, ...).  Recording the draw, not a value computed
    from it, keeps a numerical difference upstream from reading as a divergent draw."""
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    names = [r.name for r in func._schema.returns]
    seeds = [t for name, t in zip(names, outputs) if name in _RNG_RETURNS and isinstance(t, torch.Tensor)]
    seeds = [t for t in seeds if t.device == seeds[0].device] if seeds else []
    if seeds:
        return torch.cat([t.detach().reshape(-1).to(torch.int64) for t in seeds])
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    masks = [t for t in tensors if t.dtype == torch.bool]
    return masks[0] if masks else (tensors[0] if tensors else None)


class DrawLog(TorchDispatchMode):
    """Records every op tagged ``nondeterministic_seeded`` (its `rng_output`) into a `MaskLog`,
    under ``PATH (aten::op)``: the submodule path on top of `stack` when it ran.

    Logs may nest (the session's around forward and backward, one inside each wrapped forward, so
    it sits inside whatever dispatch mode the checkpoint enters for its recompute and sees a draw
    the checkpoint hands back from a stash instead of redrawing); `busy` (shared by one session's
    logs) makes the innermost one the only one that records an op.  An op with no submodule
    running is not recorded in backward: it is a backward kernel (attention's backward is
    tagged seeded too), not a recompute's draw."""

    def __init__(self, log: MaskLog, stack: list[str], busy: list[bool]) -> None:
        super().__init__()
        self.log, self.stack, self.busy = log, stack, busy

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.busy[0] or not is_seeded(func):
            return func(*args, **(kwargs or {}))
        self.busy[0] = True  # an outer log sees this op next: it must not record it again
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.busy[0] = False
        if self.stack or self.log.phase == FORWARD:
            drawn = rng_output(func, out)
            if drawn is not None:
                path = self.stack[-1] if self.stack else ""
                name = f"{path or '<module>'} ({func._schema.name})"
                self.log.record(name, drawn)
                if self.log.phase == FORWARD and drawing_in_save_region():
                    self.log.mark_saved(name)
                if drawn.device.type == "cpu" and _capturing():
                    self.log.frozen.add(name)
        return out


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never asks a torch without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def frozen_only(mismatches: list[Mismatch], frozen: "set[str]") -> bool:
    """Whether these mismatches are what host draws frozen at capture explain (`MaskLog.frozen`):
    some draw is reported (it differs, or repeats every replay: fresh-randomness), every draw
    reported is frozen, and besides them only gradients, outputs, buffers and the CPU generator's
    end state differ (what follows from other frozen values).  Then the model is not capture-safe,
    in the reference as much as in the checkpointed run, and no oracle can judge the checkpoint.
    (On an H100, transformers 5.23: BART's layer drop froze the same value in both runs, so only
    fresh-randomness saw it: stale in the reference too.)"""
    reported = [m for m in mismatches if m.oracle in ("forward-mask", "recompute-mask", "fresh-randomness")]
    # a recompute draw's subject is 'NAME (recompute K of N)'
    if not reported or any(m.subject.partition(" (recompute ")[0] not in frozen for m in reported):
        return False
    return all(m.oracle in ("forward-mask", "recompute-mask", "fresh-randomness", "gradient", "output", "buffer")
               or (m.oracle == "live-stream" and m.subject == "cpu") for m in mismatches)


def draw_path(name: str) -> str:
    """The submodule path of a draw name ``PATH (aten::op)`` ('' for the whole module's)."""
    path = name.rsplit(" (", 1)[0]
    return "" if path == "<module>" else path


def draw_op(name: str) -> str:
    """The op of a draw name ``PATH (aten::op)`` (``aten::op``)."""
    return name.rsplit(" (", 1)[-1].rstrip(")")


# The largest scaled difference (`compare.scaled_difference`: machine epsilons of the tensor's
# largest magnitude) read as rounding: another order of floating-point sums over terms of that
# magnitude stays well inside it; a value computed from other inputs does not.
ROUNDING_EPS = 1024

# Oracles that see RNG: a failure of any of these is an RNG failure, whatever else differs.
RNG_ORACLES = ("forward-mask", "recompute-mask", "live-stream", "fresh-randomness", "identity")


def worst_differences(mismatches: list[Mismatch], reference: RunRecord,
                      under_test: RunRecord) -> dict[str, float | None]:
    """Per gradient or output that differs, its largest scaled difference over the iterations
    (`compare.scaled_difference`; None: not comparable)."""
    worst: dict[str, float | None] = {}
    for m in mismatches:
        if m.oracle not in ("gradient", "output"):
            continue
        value = _scaled(reference, under_test, m)
        before = worst.get(m.subject, 0.0)
        worst[m.subject] = None if value is None or before is None else max(before, value)
    return worst


def rounding_only(mismatches: list[Mismatch], reference: RunRecord, under_test: RunRecord,
                  worst: "dict[str, float | None] | None" = None) -> bool:
    """Whether what differs is rounding alone: some gradient or output differs, no RNG oracle and
    no buffer does, and each differing tensor is within `ROUNDING_EPS` eps of its largest
    magnitude (`compare.scaled_difference`): the same terms added in another order.  `worst`:
    `worst_differences` of these mismatches, where the caller has it already."""
    if not mismatches or any(m.oracle not in ("gradient", "output") for m in mismatches):
        return False
    if worst is None:
        worst = worst_differences(mismatches, reference, under_test)
    return all(value is not None and value <= ROUNDING_EPS for value in worst.values())


def diagnose(mismatches: list[Mismatch], reference: RunRecord, under_test: RunRecord,
             worst: "dict[str, float | None] | None" = None) -> str:
    """What differs when no RNG draw does: '' when an RNG oracle failed; else which gradients,
    outputs and buffers differ, how far apart (`compare.scaled_difference`), and what that
    suggests.  It describes; it never changes the outcome.  `worst`: as for `rounding_only`."""
    if any(m.oracle in RNG_ORACLES for m in mismatches):
        return ""
    parts = []
    numeric = [m for m in mismatches if m.oracle in ("gradient", "output")]
    # Per tensor (a gradient or output name), its largest scaled difference over the iterations.
    if worst is None:
        worst = worst_differences(mismatches, reference, under_test)
    for oracle, label in (("gradient", "gradients"), ("output", "outputs")):
        names = list(dict.fromkeys(m.subject for m in numeric if m.oracle == oracle))
        if names:
            parts.append(f"{len(names)} {label} differ")
    state = [m for m in mismatches if m.oracle == "buffer"]
    if state:
        parts.append(f"{len({m.subject for m in state})} buffers differ")
    text = "no RNG draw differs and every stream ends where the reference's does: " + "; ".join(parts)
    if numeric:
        far = {n: v for n, v in worst.items() if v is None or v > ROUNDING_EPS}
        if not far:
            text += (f". Rounding-sized (each within {ROUNDING_EPS} eps of its tensor's largest magnitude), not RNG: "
                     "the checkpointed run adds the same terms in another order (a tensor's gradients from several "
                     "uses, as a reentrant checkpoint accumulates them), not other random numbers")
        else:
            name, value = max(far.items(), key=lambda item: float("inf") if item[1] is None else item[1])
            how = "not comparable" if value is None else f"{value:.3g} eps of its largest magnitude apart"
            text += (f". {len(worst) - len(far)} of {len(worst)} are rounding-sized (within {ROUNDING_EPS} eps of "
                     f"their largest magnitude); {len(far)} further, the furthest {name} ({how}): a tensor of "
                     "cancelling terms near zero (a key bias's gradient under softmax), or values computed from other "
                     "inputs than the forward's (state the forward changed, such as a KV cache left on, or an input "
                     "the checkpoint did not pass on)")
    if state:
        text += (". Module state: the recompute updated buffers again (BatchNorm's running statistics and "
                 "counter are updated by every forward in training mode)")
    return text


def _scaled(reference: RunRecord, under_test: RunRecord, m: Mismatch) -> float | None:
    """`compare.scaled_difference` of the two runs' tensors behind a gradient or output mismatch.
    A parameter's gradient is scaled by the largest magnitude among its module's parameter
    gradients too (`_module_floor`): a sum of terms that cancel (a key projection's bias under
    softmax: zero up to rounding) is measured against the terms, not against its own near-zero
    value."""
    floor = 0.0
    if m.oracle == "gradient":
        grads = reference.grads.get(m.iteration, {})
        got, expected = under_test.grads.get(m.iteration, {}).get(m.subject), grads.get(m.subject)
        floor = _module_floor(m.subject, grads)
    else:
        got_all, expected_all = (under_test.draws(m.iteration, m.subject, FORWARD),
                                 reference.draws(m.iteration, m.subject, FORWARD))
        got, expected = (got_all[0], expected_all[0]) if got_all and expected_all else (None, None)
    if got is None or expected is None:
        return None
    return scaled_difference(got, expected, floor)


def _module_floor(subject: str, grads: "dict[str, torch.Tensor]") -> float:
    """The largest magnitude of the gradients of the parameters of `subject`'s module
    (``param.encoder.layers.1.self_attn.k_proj.bias`` -> every ``param.encoder.layers.1.self_attn.k_proj.*``
    of the same dtype), 0.0 for a subject that is not a parameter's gradient."""
    if not subject.startswith("param.") or "." not in subject[len("param."):]:
        return 0.0
    own = grads.get(subject)
    if own is None:
        return 0.0
    module = subject.rsplit(".", 1)[0] + "."
    siblings = [g for name, g in grads.items() if name.startswith(module) and "." not in name[len(module):]
                and isinstance(g, torch.Tensor) and g.dtype == own.dtype and g.numel()]
    return max((float(g.detach().abs().max()) for g in siblings), default=0.0)


def first_divergent_draw(mismatches: list[Mismatch], draws: list[str]) -> str | None:
    """'recompute draw 3 of encoder.layers.1.dropout1 (aten::native_dropout): 2011/4096 elements
    differ (iteration 0)': the first draw mismatch in the order the run drew (iteration, then
    forward before recompute, then draw order), or None."""
    order = {name: n for n, name in enumerate(draws)}
    candidates = []
    for m in mismatches:
        if m.oracle not in ("forward-mask", "recompute-mask"):
            continue
        name, _, which = m.subject.partition(" (recompute ")
        name = name if which else m.subject
        if name not in order:
            continue
        k = int(which.split(" of ")[0]) if which else 1
        candidates.append(((m.iteration, m.oracle == "recompute-mask", order[name], k), m, name, k))
    if not candidates:
        return None
    _, m, name, k = min(candidates, key=lambda c: c[0])
    phase = "recompute" if m.oracle == "recompute-mask" else "forward"
    what = f"{m.count}/{m.total} elements differ" if m.total else m.detail
    return f"{phase} draw {k} of {name.rsplit(' (', 1)[0]} ({draw_op(name)}): {what} (iteration {m.iteration})"
