"""torch.autograd.graph.region_activation_memory_budget recomputes dropout with fresh randomness.

The prototype regional budget (torch 2.13) hands its budget to the min-cut partitioner under
torch.compile.  Below 1.0 the partitioner moves the dropout into the backward graph and redraws
it there: backward uses another mask than forward did, gradients are silently wrong and the CPU
generator ends ahead.  Under inductor the annotation cannot be used at all where the graph draws:
inductor adds an ``inductor_seeds`` op the annotation does not cover, and the partitioner refuses
the graph at every budget, 1.0 included.

One layer, ``F.dropout(sin(x), 0.5) * w`` on 256x256, its loss ``sum``; the whole forward under
one annotation (torch 2.13 rejects an annotation that leaves any forward op out: the script shows
that too), compiled with ``fullgraph=True``, against the same function compiled without the
annotation, from the same seed.  Counted bit for bit: the mask elements backward used that differ
from the forward's (the zeros of ``x.grad`` against the zeros of the output), and the input
gradient elements that differ from the unannotated program's.

    python torch_region_budget_rng.py

Needs torch with torch.autograd.graph.region_activation_memory_budget (2.13 or later) and, for
the inductor rows, a C++ compiler.  Exit 1 when the bug shows, 0 once fixed, 2 where this torch
has no regional budget.
"""
import torch
import torch._dynamo
import torch.nn.functional as F

N = 256
BACKENDS = ("aot_eager_decomp_partition", "inductor")  # the min-cut partitioner without and with inductor
BUDGETS = (1.0, 0.5, 0.0)  # 1.0: the control (save what the default saves)


def layer(x, w):
    return F.dropout(torch.sin(x), 0.5, training=True) * w


def program(budget, whole):
    """The compiled function: no annotation (budget None), the whole forward annotated, or only
    the layer (what ``with region_activation_memory_budget(b): x = layer(x)`` alone gives)."""
    region = torch.autograd.graph.region_activation_memory_budget

    def plain(x, w):
        y = layer(x, w)
        return y.sum(), y

    def annotated_whole(x, w):
        with region(budget):
            y = layer(x, w)
            return y.sum(), y

    def annotated_layer(x, w):
        with region(budget):
            y = layer(x, w)
        return y.sum(), y

    return plain if budget is None else annotated_whole if whole else annotated_layer


def run(backend, budget, whole=True):
    torch._dynamo.reset()
    fn = torch.compile(program(budget, whole), fullgraph=True, backend=backend)
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(N, N, generator=gen) + 0.1).requires_grad_(True)  # no zero but a dropped one
    w = (torch.rand(N, N, generator=gen) + 0.1).requires_grad_(True)
    torch.manual_seed(0)
    loss, y = fn(x, w)
    loss.backward()
    return loss.detach(), y.detach(), x.grad, torch.get_rng_state()


def bits(t):
    return t.contiguous().view(torch.int32)


def first_line(exc):
    """The partitioner's refusal in short ('must cover the entire forward ... Unannotated ops: [...]')."""
    text = " ".join(str(exc).split())
    at = text.find("Unannotated ops:")
    if "must cover the entire forward" in text and at >= 0:
        return "must cover the entire forward ... " + text[at:text.index("]", at) + 1]
    return text[:160]


def main():
    if not hasattr(torch.autograd.graph, "region_activation_memory_budget"):
        print(f"torch {torch.__version__} has no torch.autograd.graph.region_activation_memory_budget")
        return 2
    bad = 0
    for backend in BACKENDS:
        try:
            ref_loss, ref_y, ref_grad, ref_rng = run(backend, None)
        except Exception as exc:  # e.g. no C++ compiler for inductor
            print(f"{backend}: the unannotated program does not compile here: {type(exc).__name__}: "
                  f"{first_line(exc)}")
            continue
        for budget in BUDGETS:
            try:
                loss, y, grad, rng = run(backend, budget)
            except Exception as exc:
                print(f"{backend:27s} b={budget}: compile error: {first_line(exc)}")
                bad += "inductor_seeds" in str(exc)
                continue
            forward = "forward equal" if torch.equal(bits(loss), bits(ref_loss)) and torch.equal(
                ref_y == 0, y == 0) else "FORWARD DIFFERS (not comparable)"
            masks = int(((y == 0) != (grad == 0)).sum())  # backward's mask against forward's
            wrong = int((bits(grad) != bits(ref_grad)).sum())
            stream = "generator equal" if torch.equal(rng, ref_rng) else "generator ahead"
            print(f"{backend:27s} b={budget}: {forward}; {masks}/{grad.numel()} mask elements differ from the "
                  f"forward's; {wrong}/{grad.numel()} input-gradient elements differ; {stream}")
            bad += forward == "forward equal" and (masks > 0 or wrong > 0 or stream != "generator equal")
    # Documented, not the bug: only the layer annotated, the loss outside, is refused at any budget.
    for budget in BUDGETS:
        try:
            run("aot_eager_decomp_partition", budget, whole=False)
            print(f"layer-only annotation (loss outside) b={budget}: compiles")
        except Exception as exc:
            print(f"layer-only annotation (loss outside) b={budget}: compile error: {first_line(exc)}")
    print(f"torch {torch.__version__}, CPU")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
