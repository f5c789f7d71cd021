"""What the installed torch did on the machines the expectations were written on, as
`models.Machine` answers, for tests that judge CUDA cases on a machine without CUDA."""

from __future__ import annotations

from pathlib import Path

from harness.verdict.diff import load_machine
from harness.verdict.models import Machine

H200 = Path(__file__).resolve().parent.parent / "cases" / "machines" / "h200-torch2.11.json"


def h200_torch_2_11() -> Machine:
    """The attention backend torch 2.11 picked by itself on the H200 (`ops.default_backend`):
    memory-efficient for float32, cuDNN for half precision, math for the odd shape (a head dim of
    65, which no fused kernel takes), with dropout or without."""
    return load_machine(str(H200))
