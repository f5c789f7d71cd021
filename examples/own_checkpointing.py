"""A model that checkpoints itself, the way transformers and timm do, for
`python -m harness module ... --impl as-built`.

    python -m harness module examples.own_checkpointing:factory --impl as-built             # passes
    python -m harness module examples.own_checkpointing:no_rng_state --impl as-built        # fails: first draw named

Each block takes its attention mask by keyword.  With ``checkpointing=True`` the model runs a block
as transformers' ``GradientCheckpointingLayer`` does: ``torch.utils.checkpoint.checkpoint(
functools.partial(block.forward, mask=mask), x, ...)``: the keywords bound with
``functools.partial`` and the block's ``forward`` checkpointed rather than its ``__call__`` (so its
forward hooks do not run in the recompute).  `timm_style` checkpoints ``blk`` itself, one call per
block of an ``nn.Sequential``, as timm's ``checkpoint_seq`` does, with drop-path in each block.

``no_rng_state`` is the same model with ``preserve_rng_state=False``: the recompute draws its
dropout masks from wherever the generator stands after the forward, so the recompute's masks and
the gradients are wrong.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint

from harness.module_mode import ModelCase

WIDTH, BATCH, SEQ = 32, 4, 8


class Block(torch.nn.Module):
    """Masked self-attention with attention dropout, then an MLP with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.attn_dropout = torch.nn.Dropout(0.1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(2 * WIDTH, WIDTH))
        self.dropout = torch.nn.Dropout(0.1)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        weights = (q @ k.transpose(-1, -2) / WIDTH ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.attn_dropout(weights) @ v
        return x + self.dropout(self.mlp(x))


class SelfCheckpointing(torch.nn.Module):
    """Blocks that checkpoint themselves when ``gradient_checkpointing`` is on, in training."""

    def __init__(self, checkpointing: bool, reentrant: bool = False, preserve_rng_state: bool = True) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.gradient_checkpointing, self.reentrant, self.preserve = checkpointing, reentrant, preserve_rng_state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(functools.partial(block.forward, mask=mask), x,
                                                      use_reentrant=self.reentrant, preserve_rng_state=self.preserve)
            else:
                x = block(x, mask=mask)
        return x


def _inputs() -> torch.Tensor:
    return torch.rand(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))


def factory(checkpointing: bool = False) -> ModelCase:
    """Non-reentrant checkpointing of each block (transformers' default)."""
    return ModelCase(SelfCheckpointing(checkpointing), _inputs())


def reentrant(checkpointing: bool = False) -> ModelCase:
    """Reentrant checkpointing of each block (``use_reentrant=True``)."""
    return ModelCase(SelfCheckpointing(checkpointing, reentrant=True), _inputs())


def no_rng_state(checkpointing: bool = False) -> ModelCase:
    """``preserve_rng_state=False``: the recompute redraws every dropout from the wrong place."""
    return ModelCase(SelfCheckpointing(checkpointing, preserve_rng_state=False), _inputs())


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth, as timm writes it: one Bernoulli draw per sample, scaled by 1 / keep."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class DropPathBlock(torch.nn.Module):
    """An MLP block with dropout, its residual branch dropped per sample (timm's ``DropPath``)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + drop_path(self.mlp(x), self.p, self.training)


class TimmStyle(torch.nn.Module):
    """Blocks in an ``nn.Sequential``, checkpointed one by one when ``grad_checkpointing`` is on."""

    def __init__(self, checkpointing: bool) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(DropPathBlock(p) for p in (0.1, 0.2)))
        self.grad_checkpointing = checkpointing

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and self.training:
            for blk in self.blocks:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            return x
        return self.blocks(x)


def timm_style(checkpointing: bool = False) -> ModelCase:
    """timm's way: ``set_grad_checkpointing()``, each block of a Sequential checkpointed, drop-path."""
    model = TimmStyle(False)
    model.set_grad_checkpointing(checkpointing)
    return ModelCase(model, _inputs())
