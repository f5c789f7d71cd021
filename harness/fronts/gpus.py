"""One xdist worker per GPU: which GPU a worker takes, decided before its first CUDA call.

A worker claims a GPU by holding an exclusive `flock` on a per-run lock file.  It prefers the GPU
at its worker index (gw0 -> first visible GPU, gw1 -> second, ...) and otherwise takes the first
free one, so a worker that xdist restarts after a crash (it gets a new id) still lands on a GPU of
its own: the dead worker's lock went with its process.  With more workers than GPUs, the extra
workers share GPUs round-robin.  GPUs are indexed into the caller's CUDA_VISIBLE_DEVICES when it
is set.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Mapping

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
