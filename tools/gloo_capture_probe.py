"""Can two ranks sharing one GPU capture a gloo all-gather of CUDA tensors in a CUDA graph? (issue 41)

The rule of `harness.impls.ranked.uncapturable_gather_reason` rests on this; on an H100 (torch 2.11) the
eager gather gave [0, 0, 0, 0, 1, 1, 1, 1] on both ranks and the captured one raised
"AcceleratorError: CUDA error: operation failed due to a previous error during capture" on both.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tools/gloo_capture_probe.py
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
mine = torch.full((4,), float(rank), device="cuda")
gathered = torch.empty(8, device="cuda")
dist.all_gather_into_tensor(gathered, mine)
torch.cuda.synchronize()
print(f"rank {rank} eager: {gathered.tolist()}", flush=True)
side = torch.cuda.Stream()
try:
    with torch.cuda.stream(side), torch.cuda.graph(torch.cuda.CUDAGraph(), stream=side):
        dist.all_gather_into_tensor(gathered, mine)
    print(f"rank {rank} capture: no error", flush=True)
except Exception as exc:
    print(f"rank {rank} capture: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
dist.destroy_process_group()
