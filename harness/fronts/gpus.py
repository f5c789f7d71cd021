"""Which GPU a case worker takes, decided before its first CUDA call, and how many share one.

A worker claims a GPU by holding an exclusive `flock` on a per-run lock file.  It prefers the GPU
at its worker index (gw0 -> first visible GPU, gw1 -> second, ...) and otherwise takes the first
free one, so a worker that xdist restarts after a crash (it gets a new id) still lands on a GPU of
its own: the dead worker's lock went with its process.  With more workers than GPUs (`-n auto` on
CUDA starts `default_workers_per_gpu` on each), the extra workers share GPUs round-robin.  GPUs are
indexed into the caller's CUDA_VISIBLE_DEVICES when it is set.  `harness run` pins its isolated case
workers through `plan_slots` instead (no locks: it starts them all itself).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Mapping, Sequence

_HELD: list[IO[str]] = []  # lock files stay open (and locked) for the life of the process


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids this process may use, without initialising CUDA.

    CUDA_VISIBLE_DEVICES when set (its entries, in order); otherwise the indices nvidia-smi lists;
    otherwise none.
    """
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out, re.MULTILINE)]


def worker_index(worker_id: str) -> int:
    """'gw3' -> 3 (0 for anything else)."""
    match = re.fullmatch(r"gw(\d+)", worker_id)
    return int(match.group(1)) if match else 0


def claim_gpu(index: int, gpus: list[str], lock_dir: Path) -> tuple[str, bool]:
    """Pick a GPU for worker `index`: (gpu id, whether it is held exclusively).

    Tries the worker's own GPU first, then every other in order; the first lock obtained wins.
    When every GPU is taken, shares ``gpus[index % len(gpus)]``.
    """
    if not gpus:
        raise ValueError("no GPU to claim")
    lock_dir.mkdir(parents=True, exist_ok=True)
    start = index % len(gpus)
    for gpu in gpus[start:] + gpus[:start]:
        handle = open(lock_dir / f"gpu-{gpu}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _HELD.append(handle)
        return gpu, True
    return gpus[start], False


def pin_worker(worker_id: str, run_id: str, env: "os._Environ[str] | dict[str, str] | None" = None) -> str | None:
    """Point this worker's CUDA_VISIBLE_DEVICES at one GPU; return it (None when there is none).

    Must run before the process's first CUDA call: CUDA reads the variable once, at initialisation.
    """
    env = os.environ if env is None else env
    gpus = visible_gpus(env)
    if not gpus:
        return None
    lock_dir = Path(tempfile.gettempdir()) / f"ckpt-harness-gpus-{run_id}"
    gpu, _ = claim_gpu(worker_index(worker_id), gpus, lock_dir)
    env["CUDA_VISIBLE_DEVICES"] = gpu
    return gpu


# Several case workers share a GPU (issue 26): the cases are small (64x64 to 1024x1024 tensors), so
# one worker leaves the GPU nearly idle while Python, kernel launches and host syncs take the time.
WORKER_MEMORY_BYTES = 4 << 30  # a worker's CUDA context, allocator cache and cuBLAS workspaces, with room
# Workers beyond 8 gave little on one H200 (141.9 -> 151.8 cases/s from 8 to 16: processes take turns on
# the GPU) and take a core each (README, "Performance").
MAX_WORKERS_PER_GPU = 8


def gpu_memory_bytes(env: Mapping[str, str] | None = None) -> list[int]:
    """Total memory of each visible GPU in bytes (nvidia-smi; no CUDA initialisation), in the order
    of `visible_gpus`; empty where nvidia-smi cannot tell."""
    env = os.environ if env is None else env
    smi = shutil.which("nvidia-smi")
    gpus = visible_gpus(env)
    if not smi or not gpus:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", ",".join(gpus)],
                             capture_output=True, text=True, timeout=20).stdout
        sizes = [int(float(line)) << 20 for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return sizes if len(sizes) == len(gpus) else []


def default_workers_per_gpu(gpu_count: int, cores: int, memory_bytes: Sequence[int]) -> tuple[int, str]:
    """How many case workers each GPU gets by default, and why, in words: the host's cores shared
    among the GPUs, the smallest GPU's memory over `WORKER_MEMORY_BYTES` (where known), and at most
    `MAX_WORKERS_PER_GPU`."""
    if gpu_count < 1:
        raise ValueError("no GPU")
    by_cores = max(1, cores // gpu_count)
    limits = [(by_cores, f"{cores} cores / {gpu_count} GPU(s)"), (MAX_WORKERS_PER_GPU, "the cap")]
    if memory_bytes:
        smallest = min(memory_bytes)
        limits.append((max(1, smallest // WORKER_MEMORY_BYTES),
                       f"{smallest / 2**30:.0f} GiB / {WORKER_MEMORY_BYTES / 2**30:.0f} GiB a worker"))
    count, why = min(limits, key=lambda item: item[0])
    return count, why


def cuda_gpu_ids() -> list[str]:
    """The ids to pin workers to on a machine where CUDA works: `visible_gpus`, or torch's device
    indices where neither CUDA_VISIBLE_DEVICES nor nvidia-smi names them (initialises nothing)."""
    ids = visible_gpus()
    if not ids:
        import torch

        ids = [str(i) for i in range(torch.cuda.device_count())]
    return ids


def spread(gpus: Sequence[str], count: int) -> list[str]:
    """`count` workers' GPUs, in turn over `gpus` (w0 on the first, w1 on the second, ...)."""
    return [gpus[i % len(gpus)] for i in range(count)]


def pinned(device: str, count: int) -> list[str | None]:
    """The GPU of each of `count` workers for cases on `device`: spread over `cuda_gpu_ids` on
    CUDA, None each (not pinned) otherwise."""
    return spread(cuda_gpu_ids(), count) if device == "cuda" else [None] * count


def plan_slots(gpus: Sequence[str], per_gpu: int) -> list[str]:
    """The GPU of each case worker: `per_gpu` workers on every GPU, interleaved (w0 on the first
    GPU, w1 on the second, ...) so a run with fewer cases than workers still spreads over the GPUs."""
    if per_gpu < 1:
        raise ValueError(f"workers per GPU must be at least 1, got {per_gpu}")
    return spread(gpus, per_gpu * len(gpus))
