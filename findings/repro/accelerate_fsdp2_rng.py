"""accelerate's FSDP2 activation checkpointing drops dropout's randomness.

accelerate.utils.fsdp_utils.fsdp2_apply_ac wraps every auto-wrapped layer in
checkpoint_wrapper(layer, preserve_rng_state=False) (since accelerate PR #3585).  With
preserve_rng_state=False torch's checkpoint neither saves nor restores any generator, so the
recompute redraws each dropout mask from wherever the generator is: the mask used in backward is
not the forward's, the gradients are wrong, and the generator ends ahead of a run without
checkpointing (the next step draws other masks too).

This calls accelerate's own fsdp2_apply_ac on a two-layer model (a Linear and a Dropout(0.1) per
layer) with accelerate's own FullyShardedDataParallelPlugin (FSDP2, transformer-based wrap,
activation_checkpointing=True); the accelerator it takes is a stand-in carrying that plugin, which
is all fsdp2_apply_ac reads (a real Accelerator would also shard the model over a process group,
which changes nothing about the randomness).  No GPU, no process group.

    python accelerate_fsdp2_rng.py

Needs torch and accelerate.  Exit 1 while the gradients or the generator differ.
"""
import sys
import types

import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_apply_ac


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(128, 128)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.linear(x))


class Model(torch.nn.Module):
    _no_split_modules = ["Layer"]

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def step(offload=None, torch_default=False):
    """One forward and backward from the same seed; offload None: no checkpointing (or, with
    torch_default, torch's checkpoint_wrapper as FSDP1 uses it: preserve_rng_state=True)."""
    torch.manual_seed(0)
    model = Model()
    if torch_default:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for n in range(len(model.layers)):
            model.layers[n] = checkpoint_wrapper(model.layers[n])
    if offload is not None:
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Layer"],
            activation_checkpointing=True, activation_checkpointing_offload=offload)
        fsdp2_apply_ac(types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin)), model)
    x = torch.ones(128, 128, requires_grad=True)
    model(x).sum().backward()
    return x.grad, torch.get_rng_state(), model


def main():
    grad, state, _ = step()
    bad = False
    for offload in (False, True):
        got, got_state, model = step(offload)
        wrapped = type(model.layers[0]).__name__
        wrong = int((got.view(torch.int32) != grad.view(torch.int32)).sum())
        ahead = not torch.equal(got_state, state)
        where = "ends elsewhere" if ahead else "ends where a plain run"
        print(f"fsdp2_apply_ac (offload={offload}, layer wrapped as {wrapped}): {wrong} of {grad.numel()} "
              f"input-gradient elements differ; CPU generator {where}")
        bad = bad or wrong > 0 or ahead
    got, got_state, _ = step(torch_default=True)  # the control: the same wrapper, torch's default
    wrong = int((got.view(torch.int32) != grad.view(torch.int32)).sum())
    print(f"checkpoint_wrapper with torch's default (preserve_rng_state=True): {wrong} of {grad.numel()} differ; "
          f"CPU generator {'ends elsewhere' if not torch.equal(got_state, state) else 'ends where a plain run'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
