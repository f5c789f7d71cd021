"""DeepSpeed's non_reentrant_checkpoint hands the recompute's saved tensors to the wrong backward
when the recompute saves other tensors than the forward: with attention pinned by sdpa_kernel, the
process dies of a segmentation fault (or a dtype error), where torch's own checkpoint raises a
CheckpointError.

torch does not replay the sdpa_kernel context in a recompute (findings/torch-sdpa-kernel-not-replayed.md),
so attention pinned to one backend in the forward runs on the GPU's default for the dtype in the
recompute (cuDNN for bfloat16 on an H100/H200, torch 2.11), which saves other tensors.  DeepSpeed's
unpack hook takes the recomputed tensors by position, without checking them, and the attention
backward of the pinned backend reads another kernel's tensors.

    python deepspeed_sdpa_kernel_crash.py            # every variant, each in its own process

Each variant runs in a child process (a segmentation fault ends only that one) and prints one line:
the backend pinned, how deep the pinned region sits, and what backward did; the same with torch's
non-reentrant checkpoint for comparison.  Needs a CUDA GPU with cuDNN attention, torch and deepspeed.
Exit 1 while some DeepSpeed variant dies or raises something other than a clear checkpoint error.
"""
import subprocess
import sys

VARIANTS = [(backend, depth, impl) for backend in ("EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH")
            for depth in (0, 2) for impl in ("deepspeed", "torch")]


def child(backend: str, depth: int, impl: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "deepspeed":
        from deepspeed.runtime.activation_checkpointing import checkpointing

        checkpointing._configure_defaults()  # what deepspeed.checkpointing.configure() leaves by default
        checkpoint = checkpointing.non_reentrant_checkpoint
    else:
        from torch.utils.checkpoint import checkpoint as torch_checkpoint

        def checkpoint(fn, *args):
            return torch_checkpoint(fn, *args, use_reentrant=False)

    torch.manual_seed(0)
    weight = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def attention(h):
        q = h.view(1, 1, 64, 64)
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, scale=1.0 / 64).view(64, 64) * weight

    def pinned(h):  # the region entered under sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return checkpoint(attention, h)

    region = pinned
    for _ in range(depth):  # regions around it, as ((sdpa_kernel(...))) nests them
        region = (lambda inner: (lambda h: checkpoint(inner, h)))(region)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    region(x).float().sum().backward()
    torch.cuda.synchronize()
    print("backward finished")


def main() -> int:
    if len(sys.argv) == 4:
        child(sys.argv[1], int(sys.argv[2]), sys.argv[3])
        return 0
    bad = 0
    for backend, depth, impl in VARIANTS:
        done = subprocess.run([sys.executable, __file__, backend, str(depth), impl], capture_output=True, text=True)
        if done.returncode < 0:
            what = f"killed by signal {-done.returncode}"
        elif done.returncode:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            errors = [line for line in lines if "Error" in line.split(":")[0]]  # the exception's own line
            what = (errors or lines or [f"exit {done.returncode}"])[-1][:150]
        else:
            what = "no error (backward finished)"
        clear = "CheckpointError" in what or done.returncode == 0
        bad += impl == "deepspeed" and not clear
        print(f"{impl:9} {backend:19} nested {depth}: {what}")
    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"exit {int(bad > 0)}")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
