"""torch.utils.checkpoint replays autocast in the recompute but not the SDPA backend choice.

A region entered under ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` is recomputed outside
that context, on the default CUDA backend (memory-efficient or flash attention), whose dropout
draws differently: non-reentrant mode raises CheckpointError (the recomputed tensors have other
shapes), reentrant mode silently gives wrong gradients.  On the CPU the default backend is the
same kernel, so nothing shows there.

Needs torch and a CUDA device.  Exit 1 when the bug shows.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint


def region(h):
    q = h.view(1, 1, 64, 64)
    return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, scale=1 / 64).reshape(64, 64) * 2.0


def run(mode):
    torch.manual_seed(0)
    x = torch.rand(64, 64, device="cuda").requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH):
        y = region(x) if mode is None else checkpoint(region, x, use_reentrant=mode == "reentrant")
    (y * y).sum().backward()
    return x.grad


def main():
    reference, bad = run(None), 0
    for mode in ("reentrant", "nonreentrant"):
        try:
            grad = run(mode)
        except Exception as exc:  # CheckpointError
            print(f"{mode:12s}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            bad += 1
            continue
        wrong = int((grad.view(torch.int32) != reference.view(torch.int32)).sum())
        print(f"{mode:12s}: {wrong}/{grad.numel()} input-gradient elements differ")
        bad += wrong > 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
