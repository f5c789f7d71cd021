"""TransformerEngine's ``TransformerLayer(hidden_dropout=0.1, attention_dropout=0.1)`` with an RNG
tracker, for `python -m harness module` on CUDA where TransformerEngine imports.

    python -m harness module examples.te_transformer_layer:factory --impl transformer-engine
    python -m harness module examples.te_transformer_layer:factory_fp32 --impl transformer-engine
    python -m harness module examples.te_transformer_layer:factory --impl megatron --mode reentrant

The factory takes ``rng_tracker``: the harness gives it the impl's own tracker (TE's
``CudaRNGStatesTracker`` under ``--impl transformer-engine``, which ``te.checkpoint`` is then given as
``get_rng_state_tracker``; Megatron-core's under ``--impl megatron``).  The factory adds the stream
the layer forks (``model-parallel-rng``, TE's default name) and hands the tracker to the layer, as a
training script does: the attention dropout draws from that stream, the hidden dropouts from the
default CUDA generator.

``factory`` builds the layer in bf16, where TE runs cuDNN fused attention: its attention dropout is
drawn inside the kernel, so it is not a draw of the harness's log (outputs, gradients and the
tracker stream still show it).  ``factory_fp32`` builds it in fp32, where TE runs its unfused
attention and every dropout is an aten op the log names.
"""

import os

import torch

from harness.module_mode import ModelCase

# TE's attention backward may accumulate in a run-to-run order unless told not to; the harness
# checks that the model without checkpointing reproduces itself, but a deterministic backward is
# what makes the gradients comparable at all.
os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")

HIDDEN, HEADS, SEQUENCE, BATCH = 128, 4, 32, 2
STREAM, STREAM_SEED = "model-parallel-rng", 4321  # TE's default fork() name


def _layer(rng_tracker, dtype: torch.dtype) -> ModelCase:
    import transformer_engine.pytorch as te  # here, so a machine without TE gets one line from the harness

    rng_tracker.add(STREAM, STREAM_SEED)
    layer = te.TransformerLayer(HIDDEN, 4 * HIDDEN, HEADS, hidden_dropout=0.1, attention_dropout=0.1,
                                get_rng_state_tracker=lambda: rng_tracker, params_dtype=dtype, device="cuda")
    x = torch.rand(SEQUENCE, BATCH, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)  # [s, b, h]
    return ModelCase(layer, (x,))


def factory(rng_tracker) -> ModelCase:
    return _layer(rng_tracker, torch.bfloat16)


def factory_fp32(rng_tracker) -> ModelCase:
    return _layer(rng_tracker, torch.float32)
