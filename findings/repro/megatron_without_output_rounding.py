"""Megatron-core CheckpointWithoutOutput: input gradients differ from the non-checkpointed run by
rounding where a region reads its input twice and a later op reads that input too.  No random
number is involved: the checkpoint's backward returns the region's input gradient already summed
(t1 + t2), and autograd adds the later reader's term to that sum, t3 + (t1 + t2); without the
checkpoint autograd adds the three terms one by one, (t3 + t2) + t1.

Needs torch with CUDA and megatron-core (0.16-0.19 seen).  Exit 1 while the gradients differ in any
bit, 0 when they are equal.
"""

import sys

import torch
from megatron.core.tensor_parallel.random import CheckpointWithoutOutput

N = 1 << 16
device = "cuda"
gen = torch.Generator(device).manual_seed(0)
w1, w2, w3 = (torch.randn(N, device=device, generator=gen) for _ in range(3))
x0 = torch.randn(N, device=device, generator=gen)


def region(x: torch.Tensor) -> torch.Tensor:
    return x * w1 + x * w2  # the region reads its input twice


def input_gradient(checkpointed: bool) -> torch.Tensor:
    x = x0.clone().requires_grad_()
    if checkpointed:  # as Megatron's layers use it: the next op saves the output, then it is discarded
        ckpt = CheckpointWithoutOutput(fp8=None)  # None, not False: False switches FP8 on
        out = ckpt.checkpoint(region, x)
        following = torch.sin(out)  # saves its input for backward
        ckpt.discard_output_and_register_recompute(following)
    else:
        following = torch.sin(region(x))
    beside = x * w3  # a later op reading the same input
    (following + beside).sum().backward()
    return x.grad


reference, checkpointed = input_gradient(False), input_gradient(True)
differ = (reference.view(torch.int32) != checkpointed.view(torch.int32)).sum().item()
largest = (reference - checkpointed).abs().max().item()
print(f"torch {torch.__version__}: {differ} of {N} input-gradient elements differ (largest {largest:.3g})")
sys.exit(1 if differ else 0)
