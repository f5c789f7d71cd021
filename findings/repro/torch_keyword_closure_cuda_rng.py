"""torch.utils.checkpoint (use_reentrant=False) keeps the CUDA RNG only of positional tensor args.

A region whose CUDA input arrives by keyword (or through a closure, or through
functools.partial as transformers binds keywords) gets no CUDA RNG state saved: the recompute
draws other dropout masks, the input gradient is wrong, and the CUDA generator ends ahead of an
un-checkpointed run.  The same region with the input passed positionally is exact.

Needs torch and a CUDA device.  Exit 1 when the bug shows, 0 when every way is exact.
"""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def region(x):
    return F.dropout(x, 0.5, training=True) * 2.0


def run(how):
    torch.manual_seed(0)
    x = torch.rand(64, 64, device="cuda").requires_grad_(True)
    if how == "none":
        y = region(x)
    elif how == "positional":
        y = checkpoint(region, x, use_reentrant=False)
    elif how == "keyword":
        y = checkpoint(lambda *, inp: region(inp), use_reentrant=False, inp=x)
    else:  # closure
        y = checkpoint(lambda: region(x), use_reentrant=False)
    (y * y).sum().backward()
    return x.grad, torch.cuda.get_rng_state()


def main():
    grad, state = run("none")
    bad = 0
    for how in ("positional", "keyword", "closure"):
        g, s = run(how)
        wrong = int((g.view(torch.int32) != grad.view(torch.int32)).sum())
        stream = "equal" if torch.equal(s, state) else "ahead of the reference"
        print(f"{how:10s}: {wrong}/{g.numel()} input-gradient elements differ; CUDA RNG state {stream}")
        bad += wrong > 0 or stream != "equal"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
