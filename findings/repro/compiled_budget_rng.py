"""torch.compile with activation_memory_budget < 1.0 recomputes RNG ops with fresh randomness.

The min-cut partitioner may move an RNG op into the backward graph; unless it knows the op is
random it recomputes it there and draws new numbers: wrong gradients, with no error.  Each op is
compiled twice (budget 0.5 and 1.0, which saves everything) and the input gradients compared bit
for bit, per op.  pytorch/pytorch#190717, #190758 (fixes proposed: #190759, #191684).

    python compiled_budget_rng.py [cpu|cuda]

Needs torch with torch._functorch.config.activation_memory_budget.  Exit 1 when an op shows it.
"""
import sys

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch.nn.functional as F

OPS = {
    "none (control)": lambda h: h * 2.0,  # no RNG: must be exact, or the comparison is rounding
    "native_dropout": lambda h: torch.native_dropout(h, 0.5, True)[0],
    "dropout": lambda h: F.dropout(h, 0.5, training=True),
    "rand_like": lambda h: h * torch.rand_like(h),
    "randn_like": lambda h: h * torch.randn_like(h),
    "bernoulli_": lambda h: h * torch.empty_like(h).bernoulli_(0.5),
    "multinomial": lambda h: h * (torch.multinomial(torch.ones_like(h), h.shape[1], replacement=True) + 1).to(h.dtype),
    "poisson": lambda h: h * torch.poisson(torch.full_like(h, 2.0)),
    "exponential_": lambda h: h * torch.empty_like(h).exponential_(1.0),
}


def block(draw, x, w):
    h = torch.sin(x @ w)  # something worth recomputing instead of saving
    return torch.cos(draw(h) @ w).sum()


def grads(draw, budget, x, w):
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget):
        fn = torch.compile(lambda a, b: block(draw, a, b), fullgraph=True)
        torch.manual_seed(0)
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss = fn(xs, ws)
        loss.backward()
    return loss.detach(), xs.grad


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64, 64, generator=gen).to(device)
    w = (torch.rand(64, 64, generator=gen) / 64).to(device)
    bad = 0
    for name, draw in OPS.items():
        try:
            (loss_saved, saved), (loss_recomputed, recomputed) = grads(draw, 1.0, x, w), grads(draw, 0.5, x, w)
        except Exception as exc:
            print(f"{name:15s} cannot compile here: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        wrong = int((saved.view(torch.int32) != recomputed.view(torch.int32)).sum())
        # The forward draws must agree (the loss, bit for bit), or the comparison says nothing.
        forward = "forward equal" if torch.equal(loss_saved.view(torch.int32), loss_recomputed.view(torch.int32)) \
            else "FORWARD DIFFERS (not comparable)"
        print(f"{name:15s} budget 0.5 against 1.0: {forward}; {wrong}/{saved.numel()} input-gradient elements differ")
        bad += wrong > 0 and forward == "forward equal" and name != "none (control)"
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
