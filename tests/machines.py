"""What the installed torch did on the machines the expectations were written on, as
`models.Machine` answers, for tests that judge CUDA cases on a machine without CUDA."""

from __future__ import annotations

from harness.verdict.models import Machine


def h200_torch_2_11() -> Machine:
    """The attention backend torch 2.11 picked by itself on the H200 (`ops.default_backend`):
    memory-efficient for float32, cuDNN for half precision, math for the odd shape (a head dim of
    65, which no fused kernel takes), with dropout or without."""
    known = {}
    for dtype in ("f32", "bf16", "f16"):
        for shape in ("small", "odd", "large"):
            for dropout in ("dropout", "no-dropout"):
                backend = "math" if shape == "odd" else "efficient" if dtype == "f32" else "cudnn"
                known[f"sdpa.cuda.{dtype}.{shape}.{dropout}"] = backend
    return Machine(known, probe=False)
