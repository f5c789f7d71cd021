"""TransformerEngine's checkpoint with its CudaRNGStatesTracker saves live handles, not snapshots.

On a torch with the graph-safe generator APIs, TE's tracker is always graph-safe, and
``checkpoint(..., get_rng_state_tracker=...)`` saves the default CUDA generator and the tracker
streams as ``graphsafe_get_state()`` objects: live aliases.  The forward advances the "snapshot",
so the recompute draws other dropout masks (wrong gradients) and its draws leak into the live
streams: NVIDIA/TransformerEngine#3833 (#3834: without a tracker, under separate CUDA graphs, the
host-side rewind is relative to the backward graph's base offset).

Needs torch, transformer_engine (2.20.2 shows it) and a CUDA device.  Exit 1 when the bug shows.
"""
import torch
import torch.nn.functional as F
import transformer_engine
from transformer_engine.pytorch.distributed import CudaRNGStatesTracker, checkpoint


def run(reentrant, checkpointed):
    torch.manual_seed(0)
    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 2718)

    def region(h):
        h = F.dropout(h, 0.5, training=True)  # the default CUDA generator
        with tracker.fork("model-parallel-rng"):
            h = F.dropout(h, 0.5, training=True)  # the tracked stream
        return h * 2.0

    x = torch.rand(64, 64, device="cuda").requires_grad_(True)
    if checkpointed:
        y = checkpoint(region, x, use_reentrant=reentrant, get_rng_state_tracker=lambda: tracker)
    else:
        y = region(x)
    (y * y).sum().backward()
    states = [torch.cuda.get_rng_state()] + [
        s.get_state() if isinstance(s, torch.Generator) else s.clone() for s in tracker.get_states().values()]
    return x.grad, states


def main():
    bad = 0
    for reentrant in (True, False):
        ref_grad, ref_states = run(reentrant, False)
        grad, states = run(reentrant, True)
        wrong = int((grad.view(torch.int32) != ref_grad.view(torch.int32)).sum())
        moved = sum(not torch.equal(a, b) for a, b in zip(states, ref_states))
        mode = "reentrant" if reentrant else "non-reentrant"
        print(f"{mode:14s}: {wrong}/{grad.numel()} input-gradient elements differ; "
              f"{moved}/{len(states)} RNG streams end elsewhere than without checkpointing")
        bad += wrong > 0 or moved > 0
    print(f"torch {torch.__version__}, transformer_engine {transformer_engine.__version__}, "
          f"{torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
