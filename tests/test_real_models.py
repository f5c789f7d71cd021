"""Module mode on real transformers models (examples/hf_models.py: tiny configs, random weights,
no download), on the CPU: their own activation checkpointing (``--impl as-built``, turned on with
``activation_checkpointing_enable`` where this transformers has it, else
``gradient_checkpointing_enable``: `harness.checkpoint.hf`) and our checkpoints wrapped around their
blocks (``--wrap``), every dropout on.

Correct checkpoints pass; a checkpoint that does not rewind fails with its first divergent draw
named; a reentrant checkpoint that sums a shared input's gradients in another order (T5's encoder
output, read by every decoder block) has no divergent draw: its own outcome, 'rounding'.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from harness import impls
from harness.checkpoint import hf
from harness.fronts.cli import main
from harness.fronts.module_mode import run_module
from harness.model.cases import Mode
from harness.run.module_run import AsBuilt, path_matches

ROOT = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers", reason="transformers is in the test extra: pip install -e '.[test]'")
# The API this transformers turns a model's own checkpointing on with (by hasattr, as the helper
# decides): activation_checkpointing_enable from 5.23, gradient_checkpointing_enable before.
NEW_API = hasattr(transformers.PreTrainedModel, hf.ACTIVATION_API)
EXPECTED_API = hf.ACTIVATION_API if NEW_API else hf.GRADIENT_API

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


@pytest.mark.parametrize("factory, blocks", MODELS + [("gpt2_reentrant", "transformer.h.*"),
                                                     ("bart_layerdrop", "*.layers.*")])
def test_their_own_checkpointing_passes(factory, blocks):
    result = run_module(f"examples.hf_models:{factory}", AsBuilt())
    assert result.passed, _why(result)
    assert result.checkpointed and result.draws  # it checkpointed blocks, and they drew
    # The blocks themselves were seen recomputed, not their insides: since transformers 5.23 a
    # layer checkpoints its class's forward function, which the recompute calls directly.
    assert all(path_matches(p, blocks) for p in result.checkpointed), result.checkpointed
    assert (result.transformers, result.checkpointing_api) == (transformers.__version__, EXPECTED_API)


@pytest.mark.parametrize("factory, checkpointed", [
    ("gpt2_every_2", ["transformer.h.0", "transformer.h.2"]),  # block 1 keeps its activations
    ("bart_every_3", ["decoder.layers.1", "encoder.layers.0"]),  # counted on from the encoder's layers
])
def test_every_n_layers_checkpoints_every_nth_layer_and_passes(factory, checkpointed):
    result = run_module(f"examples.hf_models:{factory}", AsBuilt())
    assert result.passed, _why(result)
    assert result.checkpointed == checkpointed
    # the layers between are not checkpointed, and their draws are still compared in forward
    assert any(d.startswith(("transformer.h.1.", "encoder.layers.1", "decoder.layers.0")) for d in result.draws)


@pytest.mark.parametrize("factory", ["gpt2_offload", "gpt2_offload_reentrant"])
def test_offload_is_judged_where_memory_can_be_pinned_and_an_error_where_it_cannot(factory):
    # offload=True checkpoints inside torch's save_on_cpu(pin_memory=True, device_type=the
    # accelerator's, or 'cpu'): with no accelerator torch has no pinned-memory allocator, and the
    # model's own checkpointing raises in its first forward (transformers 5.17 and 5.23 alike).
    result = run_module(f"examples.hf_models:{factory}", AsBuilt())
    assert result.checkpointing_api == EXPECTED_API
    if torch.accelerator.current_accelerator() is None:
        assert result.outcome == "error" and "pin_memory=True requires" in result.error, _why(result)
    else:
        assert result.passed and result.checkpointed == ["transformer.h.0", "transformer.h.1"], _why(result)


def test_the_report_names_the_transformers_version_and_the_api_used(tmp_path, capsys):
    assert main(["module", "examples.hf_models:gpt2", "--impl", "as-built,neg-no-rewind", "--wrap", "transformer.h.*",
                 "--device", "cpu", "--report-dir", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert f"transformers {transformers.__version__}; its checkpointing on through {EXPECTED_API}\n" in out
    records = {r["impl"]: r for r in map(json.loads, (tmp_path / "r" / "results.jsonl").read_text().splitlines())}
    assert (records["as-built"]["transformers"], records["as-built"]["checkpointing_api"]) == (
        transformers.__version__, EXPECTED_API)
    # under an impl the model's own checkpointing stays off: the version, and no API
    assert (records["neg-no-rewind"]["transformers"], records["neg-no-rewind"]["checkpointing_api"]) == (
        transformers.__version__, "")
    # the failing run's details in the HTML name the version too
    page = (tmp_path / "r" / "report.html").read_text()
    assert f'<p class="muted">transformers {transformers.__version__}</p>' in page


@pytest.mark.skipif(not NEW_API, reason=f"transformers {transformers.__version__} has no {hf.ACTIVATION_API} "
                    f"(5.23 has it): {hf.GRADIENT_API} is this version's API, and it is not deprecated")
def test_nothing_of_ours_warns_about_the_deprecated_api():
    import examples.hf_models as models

    factories = [m for m, _ in MODELS] + ["gpt2_reentrant", "gpt2_every_2", "llama", "t5_reentrant", "bart",
                                          "bart_layerdrop", "bart_every_3"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in factories:
            case = getattr(models, name)(checkpointing=True)
            assert hf.used_api(case.module) == hf.ACTIVATION_API
            out = case.module(**case.inputs)
            floats = [t for t in out.values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
            sum(t.float().sum() for t in floats).backward()
    assert not [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    # the control: the old method itself warns, and this capture sees it
    with warnings.catch_warnings(record=True) as control:
        warnings.simplefilter("always")
        models.gpt2().module.gradient_checkpointing_enable()
    assert any(issubclass(w.category, FutureWarning) and "deprecated" in str(w.message) for w in control)


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
