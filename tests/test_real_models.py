"""Module mode on real transformers models (examples/hf_models.py: tiny configs, random weights,
no download), on the CPU: their own gradient checkpointing (``--impl as-built``) and our
checkpoints wrapped around their blocks (``--wrap``), every dropout on.

Correct checkpoints pass; a checkpoint that does not rewind fails with its first divergent draw
named; a reentrant checkpoint that sums a shared input's gradients in another order (T5's encoder
output, read by every decoder block) has no divergent draw: its own outcome, 'rounding'.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import impls
from harness.fronts.module_mode import AsBuilt, run_module
from harness.model.cases import Mode

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("transformers", reason="transformers is in the test extra: pip install -e '.[test]'")

# (factory, blocks): a decoder (GPT-2 eager and sdpa, Llama sdpa), an encoder (BERT) and an
# encoder-decoder (T5), with the --wrap pattern of their blocks.
MODELS = [
    ("gpt2", "transformer.h.*"),
    ("gpt2_sdpa", "transformer.h.*"),
    ("llama_sdpa", "layers.*"),
    ("bert", "encoder.layer.*"),
    ("t5", "*.block.*"),
]


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def _why(result):
    return result.outcome, result.error, result.reason, [m.message() for m in result.mismatches[:3]]


@pytest.mark.parametrize("factory", [m for m, _ in MODELS] + ["gpt2_reentrant", "bart_layerdrop"])
def test_their_own_checkpointing_passes(factory):
    result = run_module(f"examples.hf_models:{factory}", AsBuilt())
    assert result.passed, _why(result)
    assert result.checkpointed and result.draws  # it checkpointed blocks, and they drew


@pytest.mark.parametrize("factory, blocks", MODELS)
@pytest.mark.parametrize("impl", ["bundled", "torch"])
def test_correct_checkpoints_around_their_blocks_pass(factory, blocks, impl):
    result = run_module(f"examples.hf_models:{factory}", impls.load(impl), wrap=[blocks])
    assert result.passed, _why(result)


@pytest.mark.parametrize("factory, blocks", [("gpt2", "transformer.h.*"), ("bert", "encoder.layer.*"),
                                             ("llama_sdpa", "layers.*")])
@pytest.mark.parametrize("impl", ["bundled", "torch"])
def test_reentrant_checkpoints_get_the_blocks_keywords_and_pass(factory, blocks, impl):
    # transformers passes attention masks and positions by keyword; reentrant checkpoints get them
    # bound with functools.partial, as transformers binds them.
    result = run_module(f"examples.hf_models:{factory}", impls.load(impl), mode=Mode.REENTRANT, wrap=[blocks])
    assert result.passed, _why(result)


# Their eager attention calls F.dropout on the attention weights: the draw is the attention module's.
@pytest.mark.parametrize("factory, blocks, first", [
    ("gpt2", "transformer.h.*", "recompute draw 1 of transformer.h.0.attn (aten::bernoulli_): "),
    ("bert", "encoder.layer.*", "recompute draw 1 of encoder.layer.0.attention.self (aten::bernoulli_): "),
    ("t5", "*.block.*", "recompute draw 1 of encoder.block.0.layer.0.SelfAttention (aten::bernoulli_): "),
])
def test_a_checkpoint_that_does_not_rewind_fails_at_its_first_draw(factory, blocks, first):
    result = run_module(f"examples.hf_models:{factory}", impls.load("neg-no-rewind"), wrap=[blocks])
    assert result.outcome == "mismatch"
    assert result.first_divergent.startswith(first), result.first_divergent


@pytest.mark.parametrize("how", ["as-built", "torch"])
def test_reentrant_t5_differs_by_rounding_with_no_divergent_draw(how):
    if how == "as-built":
        result = run_module("examples.hf_models:t5_reentrant", AsBuilt())
    else:
        result = run_module("examples.hf_models:t5", impls.load("torch"), mode=Mode.REENTRANT, wrap=["*.block.*"])
    assert result.outcome == "rounding" and result.first_divergent is None
    assert {m.oracle for m in result.mismatches} == {"gradient"}
    assert "Rounding-sized" in result.diagnosis and "not RNG" in result.diagnosis


def test_a_reentrant_checkpoint_of_a_whole_model_fed_token_ids_is_torchs_error_with_its_warning():
    result = run_module("examples.hf_models:gpt2", impls.load("torch"), mode=Mode.REENTRANT)
    assert result.outcome == "error" and "element 0 of tensors does not require grad" in result.error
    assert any("None of the inputs have requires_grad=True" in w for w in result.warnings)
