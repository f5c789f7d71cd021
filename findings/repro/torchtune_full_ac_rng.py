"""torchtune's full activation checkpointing drops dropout's randomness.

torchtune.training.activations.checkpoint_wrapper(module, ac_mode="full", ac_style=None) returns
torch's checkpoint_wrapper(module, CheckpointImpl.NO_REENTRANT, checkpoint_fn=checkpoint,
use_reentrant=False, preserve_rng_state=False).  With preserve_rng_state=False torch's checkpoint
neither saves nor restores any generator, so the recompute redraws each dropout mask from wherever
the generator is: the mask used in backward is not the forward's, the gradients are wrong, and the
generator ends ahead of a run without checkpointing.

This wraps two layers (a Linear and a Dropout(0.1) each) with torchtune's own function and compares
one forward and backward with the same layers unwrapped, from the same seed.  No GPU.

    python torchtune_full_ac_rng.py

Needs torch and torchtune (whose import needs torchao).  Exit 1 while the gradients or the
generator differ.
"""
import sys

import torch
from torchtune.training.activations import checkpoint_wrapper


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(128, 128)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.linear(x))


def step(wrapped):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([Layer(), Layer()])
    if wrapped:
        for n in range(len(layers)):
            layers[n] = checkpoint_wrapper(layers[n], "full", None)
    x = torch.randn(128, 128, requires_grad=True)
    h = x
    for layer in layers:
        h = layer(h)
    h.sum().backward()
    return x.grad, torch.get_rng_state()


(plain_grad, plain_state), (ac_grad, ac_state) = step(False), step(True)
wrong = (plain_grad.view(torch.int32) != ac_grad.view(torch.int32)).sum().item()
moved = not torch.equal(plain_state, ac_state)
print(f"torch {torch.__version__}: {wrong} of {plain_grad.numel()} input-gradient elements differ; "
      f"generator {'ends elsewhere' if moved else 'ends where it should'}")
sys.exit(1 if wrong or moved else 0)
