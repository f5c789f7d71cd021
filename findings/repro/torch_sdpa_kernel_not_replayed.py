"""torch.utils.checkpoint replays autocast in the recompute but not the SDPA backend choice.

A region entered under ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` is recomputed outside
that context, on the device's default backend for the input.  On CUDA that is memory-efficient or
flash attention, whose dropout draws differently; on the CPU, attention without dropout runs on its
flash kernel (with dropout the CPU default is the math kernel itself, so nothing shows there).
Either way non-reentrant mode raises CheckpointError (the recomputed tensors have other shapes)
and reentrant mode silently gives other gradients.

Needs torch; runs on CUDA where a device is visible, else on the CPU.  Exit 1 when the bug shows.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def region(h, dropout_p):
    q = h.view(1, 1, 64, 64)
    return F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p, scale=1 / 64).reshape(64, 64) * 2.0


def run(mode, dropout_p):
    torch.manual_seed(0)
    x = torch.rand(64, 64, device=DEVICE).requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH):
        if mode is None:
            y = region(x, dropout_p)
        else:
            y = checkpoint(region, x, dropout_p, use_reentrant=mode == "reentrant")
    (y * y).sum().backward()
    return x.grad


def main():
    bad = 0
    for dropout_p in (0.5, 0.0):
        reference = run(None, dropout_p)
        for mode in ("reentrant", "nonreentrant"):
            label = f"dropout {dropout_p}, {mode}"
            try:
                grad = run(mode, dropout_p)
            except Exception as exc:  # CheckpointError
                print(f"{label:25s}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
                bad += 1
                continue
            wrong = int((grad.view(torch.int32) != reference.view(torch.int32)).sum())
            print(f"{label:25s}: {wrong}/{grad.numel()} input-gradient elements differ")
            bad += wrong > 0
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
