"""What holds device memory after many cases (issue 42, item 3; GPU only).

On an H100 (torch 2.11) `bench --impl bundled --cases 2000` saw allocated device memory grow
1.8 -> 488 MiB and reserved 18 -> 914 MiB over six passes of the default CUDA matrix, with no
result kept.  This runs `passes` passes of the matrix as `harness run` runs them (in this
process), with torch's allocator history on from the second pass, and then says:

* allocated and reserved memory after each pass;
* the live CUDA tensors Python can reach (gc), by count and bytes;
* the active allocator blocks by the Python stack that allocated them (the three innermost
  frames), largest first;
* allocated memory after freeing cuBLAS's per-stream workspaces, and reserved after
  ``empty_cache``.

    python tools/memory_growth_probe.py [passes] [impl]
"""

import gc
import sys
from collections import Counter, defaultdict

import torch

from harness.impls import ImplError
from harness.model.matrix import generate
from harness.run.execution import load_targets, run_case
from harness.verdict import expectations

MiB = 2**20


def _mib(value: float) -> str:
    return f"{value / MiB:.1f}"


def _frames(block_frames: list[dict]) -> str:
    """The three innermost Python frames of an allocation, file:line name."""
    python = [f for f in block_frames if f.get("filename", "").endswith(".py")]
    return " <- ".join(f"{f['filename'].split('site-packages/')[-1].split('/work/')[-1]}:{f['line']} {f['name']}"
                       for f in python[:3]) or "(no Python frame)"


def main() -> None:
    try:
        passes = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    except ValueError:
        sys.exit(f"memory_growth_probe: passes must be a whole number, got {sys.argv[1]!r}")
    if passes < 1:
        sys.exit(f"memory_growth_probe: passes must be at least 1, got {passes}")
    impl = sys.argv[2] if len(sys.argv) > 2 else "bundled"
    try:
        [target] = load_targets([impl])
    except ImplError as exc:
        sys.exit(f"memory_growth_probe: {exc}")
    if not torch.cuda.is_available():
        sys.exit("memory_growth_probe: no CUDA device is visible (it measures device memory)")
    entries = expectations.load()
    cases = list(generate(device="cuda"))
    torch.cuda.init()
    print(f"{impl}: {len(cases)} cases a pass, {passes} passes, {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}")
    for number in range(1, passes + 1):
        if number == 2:
            torch.cuda.memory._record_memory_history(max_entries=200000)
        for case in cases:
            run_case(target, case, entries)
        gc.collect()
        print(f"after pass {number}: allocated {_mib(torch.cuda.memory_allocated())} MiB, "
              f"reserved {_mib(torch.cuda.memory_reserved())} MiB", flush=True)
    live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    shapes = Counter((tuple(t.shape), str(t.dtype)) for t in live)
    print(f"live CUDA tensors reachable by gc: {len(live)}, "
          f"{_mib(sum(t.untyped_storage().nbytes() for t in live))} MiB; commonest: {shapes.most_common(5)}")
    snapshot = torch.cuda.memory._snapshot()
    by_stack: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                key = f"[pool {segment.get('segment_pool_id')}, stream {segment.get('stream')}] " + \
                    _frames(block.get("frames", []))
                by_stack[key][0] += block["size"]
                by_stack[key][1] += 1
    print("active blocks by allocating stack (allocated since pass 2 are attributed; earlier ones show no frame):")
    for key, (size, count) in sorted(by_stack.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"  {_mib(size):>8} MiB in {count:5} blocks  {key}")
    torch.cuda.memory._record_memory_history(enabled=None)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
        print(f"after clearing cuBLAS workspaces: allocated {_mib(torch.cuda.memory_allocated())} MiB")
    torch.cuda.empty_cache()
    print(f"after empty_cache: reserved {_mib(torch.cuda.memory_reserved())} MiB")


if __name__ == "__main__":
    main()
