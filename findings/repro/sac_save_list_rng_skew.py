"""Selective activation checkpointing with a save list skips RNG advances in the recompute.

A policy that must-saves an op which draws random numbers (torchtitan's save list keeps the
fused attention ops; attention dropout > 0 draws inside them) leaves that op out of the
recompute, so it does not advance the RNG stream there; the RNG op after it (F.dropout) then
redraws from a shifted position: wrong input gradients, while the outputs and the live RNG
state match an un-checkpointed run.

    python sac_save_list_rng_skew.py           # CUDA: torchtitan's policy, efficient/flash/cuDNN attention
    python sac_save_list_rng_skew.py --cpu     # CPU: a policy that must-saves the first rand_like

Needs torch (>= 2.4, create_selective_checkpoint_contexts).  Exit 1 when the bug shows.
"""
import collections
import functools
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

TITAN_SAVE = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention.default,
              torch.ops.aten._scaled_dot_product_cudnn_attention.default,
              torch.ops.aten._scaled_dot_product_attention_math.default, torch.ops.aten.max.default}


def titan_context():
    """torchtitan's op-level SAC policy: save the list, except every second mm."""
    counts = collections.Counter()

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        save = func in TITAN_SAVE and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def save_first_rng_context():
    """Must-save the first RNG op of the region, recompute the rest."""
    counts = collections.Counter()

    def policy(ctx, func, *args, **kwargs):
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return CheckpointPolicy.PREFER_RECOMPUTE
        key = "recompute" if ctx.is_recompute else "forward"
        counts[key] += 1
        return CheckpointPolicy.MUST_SAVE if counts[key] == 1 else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def attention_block(backend, q):
    with sdpa_kernel(backend):
        h = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    return F.dropout(h, 0.1, training=True) * 2.0


def random_block(x):
    return x * torch.rand_like(x) * torch.rand_like(x)


def compare(block, x, context_fn):
    results = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        leaf = x.detach().clone().requires_grad_(True)
        y = checkpoint(block, leaf, use_reentrant=False, context_fn=context_fn) if checkpointed else block(leaf)
        y.float().square().sum().backward()
        state = torch.cuda.get_rng_state() if x.is_cuda else torch.get_rng_state()
        results.append((y.detach(), leaf.grad, state))
    (y0, g0, s0), (y1, g1, s1) = results
    bits = {2: torch.int16, 4: torch.int32}[g0.element_size()]
    wrong = int((g0.view(bits) != g1.view(bits)).sum())
    return wrong, g0.numel(), torch.equal(y0.view(bits), y1.view(bits)), torch.equal(s0, s1)


def main():
    bad = 0
    if "--cpu" in sys.argv:
        x = torch.rand(128, 128) + 0.5
        cases = [("rand_like, first one saved", random_block, x, save_first_rng_context)]
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        cases = []
        for name, backend, dtype in [("efficient f32", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                                     ("efficient bf16", SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16),
                                     ("flash bf16", SDPBackend.FLASH_ATTENTION, torch.bfloat16),
                                     ("cuDNN bf16", SDPBackend.CUDNN_ATTENTION, torch.bfloat16)]:
            q = torch.rand(1, 4, 64, 64, device="cuda", dtype=dtype)
            cases.append((f"titan policy, {name}", functools.partial(attention_block, backend), q, titan_context))
    torch.use_deterministic_algorithms(True, warn_only=True)  # attention backward bit-reproducible
    for label, block, x, context_fn in cases:
        try:
            wrong, total, outputs_equal, state_equal = compare(block, x, context_fn)
        except RuntimeError as exc:
            print(f"{label}: cannot run here: {str(exc).splitlines()[0]}")
            continue
        print(f"{label}: {wrong}/{total} input-gradient elements differ; outputs "
              f"{'equal' if outputs_equal else 'differ'}; RNG state {'equal' if state_equal else 'differs'}")
        bad += wrong > 0
    device = "CPU" if "--cpu" in sys.argv else torch.cuda.get_device_name()
    print(f"torch {torch.__version__}, {device}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
