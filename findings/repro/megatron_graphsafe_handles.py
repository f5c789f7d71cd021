"""Megatron-core's checkpoint with the graph-safe tracker saves live handles, not snapshots.

With ``initialize_rng_tracker(use_cudagraphable_rng=True)``, ``_get_all_rng_states()`` stores
``graphsafe_get_state()`` objects for the default CUDA generator and every tracker stream: live
aliases of the generators' state.  The forward advances the "snapshot" with every draw, so the
recompute starts where the forward ended: other dropout masks, wrong gradients, and the recompute's
draws move the live streams.  The plain tracker (use_cudagraphable_rng=False) is exact.

Needs torch, megatron-core (0.16 to 0.19.x show it) and a CUDA device.  Exit 1 when the bug shows.
"""
import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import random as mrandom


def fresh_tracker(graphsafe):
    mrandom.initialize_rng_tracker(use_cudagraphable_rng=graphsafe, force_reset=True)
    tracker = mrandom.get_cuda_rng_tracker(use_cudagraphable_rng=graphsafe)
    assert bool(getattr(tracker, "use_cudagraphable_rng", False)) == graphsafe, "got another tracker kind"
    tracker.add("model-parallel-rng", 2718)
    return tracker


def run(graphsafe, checkpointed):
    torch.manual_seed(0)
    tracker = fresh_tracker(graphsafe)

    def region(h):
        h = F.dropout(h, 0.5, training=True)  # the default CUDA generator
        with tracker.fork("model-parallel-rng"):
            h = F.dropout(h, 0.5, training=True)  # the tracked stream
        return h * 2.0

    x = torch.rand(64, 64, device="cuda").requires_grad_(True)
    y = mrandom.checkpoint(region, False, x) if checkpointed else region(x)
    (y * y).sum().backward()
    states = mrandom._get_all_rng_states()
    values = [torch.cuda.get_rng_state()] + [
        s.get_state() if isinstance(s, torch.Generator) else s for s in tracker.get_states().values()]
    del states
    return x.grad, values


def main():
    bad = 0
    for graphsafe in (False, True):
        ref_grad, ref_states = run(graphsafe, False)
        grad, states = run(graphsafe, True)
        wrong = int((grad.view(torch.int32) != ref_grad.view(torch.int32)).sum())
        moved = sum(not torch.equal(a, b) for a, b in zip(states, ref_states))
        kind = "graph-safe" if graphsafe else "plain"
        print(f"{kind:10s} tracker: {wrong}/{grad.numel()} input-gradient elements differ; "
              f"{moved}/{len(states)} RNG streams end elsewhere than without checkpointing")
        bad += wrong > 0 or moved > 0
    version = getattr(getattr(__import__("megatron.core"), "core", None), "__version__", "?")
    print(f"torch {torch.__version__}, megatron-core {version}, {torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
