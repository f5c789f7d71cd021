"""`torch.nn.TransformerEncoderLayer(dropout=0.1)` for `python -m harness module`.

    python -m harness module examples.transformer_layer:factory --impl torch
    python -m harness module examples.transformer_layer:factory --impl torch --wrap self_attn --wrap dropout1

Dropout draws in three places per forward: the attention weights (inside ``self_attn``), after the
attention block (``dropout1``) and in the feed-forward block (``dropout``, ``dropout2``).
"""

import torch

from harness.module_mode import ModelCase


def factory() -> ModelCase:
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.1,
                                             batch_first=True)
    x = torch.rand(2, 8, 32, generator=torch.Generator().manual_seed(1))
    return ModelCase(layer, (x,))
