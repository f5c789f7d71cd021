"""Models whose randomness is per sample or per layer, for `python -m harness module`.

    python -m harness module examples.stochastic_depth:drop_path --impl torch --wrap 'blocks.*'
    python -m harness module examples.stochastic_depth:layer_drop --impl bundled --wrap 'layers.*'
    python -m harness module examples.stochastic_depth:batch_norm --impl torch --wrap 'blocks.*'   # fails: buffers

* `drop_path`: stochastic depth at batch 4 (timm's ``DropPath``: one Bernoulli draw per sample,
  ``x.new_empty(batch, 1, 1).bernoulli_(keep)``).  Such a mask repeats from one iteration to the
  next by chance, in the reference too: that is no stale RNG.
* `layer_drop`: each layer is skipped at random (a ``torch.rand([])`` draw in the parent, as
  BART's and Whisper's ``layerdrop`` do), so a wrapped layer draws in some iterations and not in
  others: it need only be recomputed where it ran.
* `batch_norm`: blocks with BatchNorm and dropout.  A recompute runs BatchNorm's forward again
  in training mode, which updates its running statistics and counter a second time: every
  checkpoint fails its ``buffer`` oracle, as it should (use eval-mode BatchNorm or a norm without
  state inside checkpointed regions).
"""

from __future__ import annotations

import torch

from examples.own_checkpointing import drop_path as stochastic_depth
from harness.module_mode import ModelCase

WIDTH = 16


def _inputs(batch: int) -> torch.Tensor:
    return torch.rand(batch, 8, WIDTH, generator=torch.Generator().manual_seed(1))


class DropPathBlock(torch.nn.Module):
    """An MLP with dropout on a residual branch that is dropped per sample."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + stochastic_depth(self.mlp(x), self.p, self.training)


class Stack(torch.nn.Module):
    """``blocks``, one after the other."""

    def __init__(self, *blocks: torch.nn.Module) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def drop_path() -> ModelCase:
    """Two blocks with drop-path 0.02 at batch 4: their per-sample masks are mostly all ones, so
    they repeat from one iteration to the next, in the reference as in any checkpoint (the second
    block's does here)."""
    return ModelCase(Stack(DropPathBlock(0.02), DropPathBlock(0.02)), _inputs(4))


class LayerDrop(torch.nn.Module):
    """Layers each skipped with probability `p` in training (one ``torch.rand([])`` per layer)."""

    def __init__(self, p: float = 0.4, count: int = 4) -> None:
        super().__init__()
        self.p = p
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Dropout(0.1))
            for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and bool(torch.rand([]) < self.p):
                continue
            x = x + layer(x)
        return x


def layer_drop() -> ModelCase:
    """Four layers, each skipped with probability 0.4: the layers that run change per iteration
    (here layers 1 and 3 in the first, 0 and 1 in the second)."""
    return ModelCase(LayerDrop(), _inputs(4))


class NormBlock(torch.nn.Module):
    """Linear, BatchNorm (over the features), ReLU and dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.linear(x).transpose(1, 2)).transpose(1, 2)
        return x + self.dropout(torch.relu(h))


def batch_norm() -> ModelCase:
    """Two blocks with BatchNorm in training mode: a recompute updates the running statistics again."""
    return ModelCase(Stack(NormBlock(), NormBlock()), _inputs(4))
