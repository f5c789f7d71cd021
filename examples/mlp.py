"""A small MLP with dropout for `python -m harness module`.

    python -m harness module examples.mlp:factory --impl bundled
    python -m harness module examples.mlp:factory --impl neg-no-rewind     # names the first bad draw
"""

import torch

from harness.module_mode import ModelCase


def factory() -> ModelCase:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 64), torch.nn.Dropout(0.1),
    )
    x = torch.rand(16, 64, generator=torch.Generator().manual_seed(1))
    return ModelCase(mlp, x)
