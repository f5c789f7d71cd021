"""Importing TransformerEngine maps a second cuDNN into a process whose torch already uses one.

TransformerEngine's loader (``transformer_engine/common/__init__.py``, ``_load_cuda_library``)
prefers the system's cuDNN (CUDA_HOME, /usr/local/cuda, then the linker's path) and opens it with
``RTLD_GLOBAL``; torch's CUDA wheels use the cuDNN of the ``nvidia-cudnn-cu13`` package.  Where the
two are different files, the process holds two cuDNN builds.  This script prints the cuDNN core
libraries mapped and torch's own attention choice for a half-precision call with dropout, before
and after ``import transformer_engine.pytorch``, then runs cuDNN attention with dropout under one
CUDA graph (forward and backward) a few times, each in its own process.

Usage: python te_second_cudnn.py   (CUDA, torch and transformer_engine; exit 1 where the import
adds a second cuDNN core library, 0 where the process keeps one).
"""

from __future__ import annotations

import re
import subprocess
import sys

CORE = re.compile(r"/libcudnn\.so\.\d+(\.\d+)*$")
BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}


def cudnn_copies() -> list[str]:
    """The cuDNN core libraries mapped into this process (Linux)."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
    return sorted(p for p in paths if CORE.search(p))


def attention_choice() -> str:
    import torch

    q = torch.zeros(1, 1, 64, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    return BACKENDS.get(int(torch._fused_sdp_choice(q, q, q, None, 0.5)), "other")


def captured_cudnn_attention() -> None:
    """cuDNN attention with dropout, forward and backward in one CUDA graph, replayed twice."""
    import torch
    import torch.nn.functional as F
    import transformer_engine.pytorch  # noqa: F401
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x = torch.randn(1, 1, 64, 64, device="cuda", dtype=torch.float16, requires_grad=True)

    def step() -> None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(x, x, x, dropout_p=0.5).float().sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()


def main() -> int:
    if sys.argv[1:] == ["--captured"]:
        captured_cudnn_attention()
        return 0
    import torch

    torch.backends.cudnn.version()  # torch loads its cuDNN
    before, choice_before = cudnn_copies(), attention_choice()
    import transformer_engine.pytorch  # noqa: F401

    after, choice_after = cudnn_copies(), attention_choice()
    print(f"cuDNN core libraries before TE: {before}; torch picks {choice_before} for f16 attention with dropout")
    print(f"cuDNN core libraries after TE:  {after}; torch picks {choice_after}")
    for attempt in range(5):
        run = subprocess.run([sys.executable, __file__, "--captured"], capture_output=True, text=True, timeout=300)
        last = (run.stderr.strip().splitlines() or ["ok"])[-1] if run.returncode else "ok"
        print(f"captured cuDNN attention, process {attempt + 1}: exit {run.returncode}: {last[:160]}")
    return 1 if len(after) > len(before) else 0


if __name__ == "__main__":
    sys.exit(main())
