"""A model that checkpoints itself with torch_remat, a SAVE region around its attention, for
`python -m harness module ... --impl as-built` (issue 38).

    python -m harness module examples.remat_model:with_hook --impl as-built --mode nonreentrant    # passes
    python -m harness module examples.remat_model:no_hook --impl as-built --mode nonreentrant      # fails
    python -m harness module examples.remat_model:readme_hook --impl as-built --mode nonreentrant  # raises on the CPU

Each block runs ``remat.checkpoint(region_name=..., recompute_state_hooks=hooks)(block)(x)``, and
inside it ``remat.region(attention, "attention", recompute=False)``: the attention (with attention
dropout) is saved, not recomputed, so its dropout does not draw again in the recompute; the MLP's
dropout after it is recomputed and must draw the forward's mask.  torch_remat realigns random state
only through its hooks, at region entry and after each SAVE region:

* ``with_hook``: the harness's `RecomputeRNGHook` (every live generator by value): bit for bit;
* ``no_hook``: torch_remat's default: the MLP's dropout is redrawn from wherever the generator is;
* ``readme_hook``: the README's ``CudaRNGStateHook``: on a CUDA model right for the default
  generator; a CPU model raises at region entry.
"""

from __future__ import annotations

import torch

from harness.checkpoint import RecomputeRNGHook
from harness.module_mode import ModelCase

WIDTH, BATCH, SEQ = 32, 4, 8


class Block(torch.nn.Module):
    """Self-attention with attention dropout (a SAVE region under torch_remat), then an MLP with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.attn_dropout = torch.nn.Dropout(0.1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(2 * WIDTH, WIDTH))
        self.dropout = torch.nn.Dropout(0.1)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.saving = False  # inside a torch_remat checkpoint: mark the attention a SAVE region

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        weights = (q @ k.transpose(-1, -2) / WIDTH ** 0.5).softmax(-1)
        return self.attn_dropout(weights) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.saving:
            import torch_remat as remat

            attn = remat.region(self.attention, "attention", recompute=False)(x)
            remat.recompute_needs_tensor(attn)
        else:
            attn = self.attention(x)
        x = x + attn
        return x + self.dropout(self.mlp(x))


class RematModel(torch.nn.Module):
    """Blocks that checkpoint themselves with torch_remat when ``checkpointing`` is on, in training."""

    def __init__(self, checkpointing: bool, hooks: str) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.checkpointing, self.hooks = checkpointing, hooks
        for block in self.blocks:
            block.saving = checkpointing

    def _hooks(self, x: torch.Tensor) -> tuple:
        if self.hooks == "harness":
            return (RecomputeRNGHook(),)
        if self.hooks == "readme":
            from harness.impls.remat import CudaRNGStateHook

            return (CudaRNGStateHook(x.device),)
        return ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for n, block in enumerate(self.blocks):
            if self.checkpointing and self.training:
                import torch_remat as remat

                x = remat.checkpoint(region_name=f"blocks.{n}", recompute_state_hooks=self._hooks(x))(block)(x)
            else:
                x = block(x)
        return x


def _inputs() -> torch.Tensor:
    return torch.rand(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))


def with_hook(checkpointing: bool = False) -> ModelCase:
    """torch_remat with the harness's RecomputeRNGHook: right."""
    return ModelCase(RematModel(checkpointing, "harness"), _inputs())


def no_hook(checkpointing: bool = False) -> ModelCase:
    """torch_remat's default, no hook: the recompute's dropout masks are redrawn."""
    return ModelCase(RematModel(checkpointing, "none"), _inputs())


def readme_hook(checkpointing: bool = False) -> ModelCase:
    """torch_remat with its README's CUDA-only hook."""
    return ModelCase(RematModel(checkpointing, "readme"), _inputs())
