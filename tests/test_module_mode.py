"""`python -m harness module`: your own model under test (harness/fronts/module_mode.py, its run
harness/run/module_run.py), on the CPU.

The examples under examples/ pass under `bundled` and `torch` and fail under a negative control,
with the first divergent RNG draw named; bad input is one line and exit status 2.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import impls
from harness.fronts.cli import main
from harness.fronts.module_mode import run_module
from harness.fronts.module_report import summary
from harness.impls.base import Adapter
from harness.impls.bundled import BundledAdapter
from harness.model.cases import Capture, Mode
from harness.run.module_run import AsBuilt, ModuleError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("examples.mlp:factory", "examples.transformer_layer:factory")


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


@pytest.mark.parametrize("factory", EXAMPLES)
@pytest.mark.parametrize("impl", ["bundled", "torch"])
def test_the_examples_pass_under_correct_checkpoints(factory, impl):
    result = run_module(factory, impls.load(impl))
    assert result.passed, [m.message() for m in result.mismatches[:3]]
    assert result.draws and result.first_divergent is None


@pytest.mark.parametrize("factory, first", [
    ("examples.mlp:factory", "recompute draw 1 of 2 (aten::bernoulli_): "),
    ("examples.transformer_layer:factory", "recompute draw 1 of self_attn (aten::bernoulli_): "),
])
def test_a_control_that_never_rewinds_is_caught_at_its_first_draw(factory, first):
    result = run_module(factory, impls.load("neg-no-rewind"))
    assert not result.passed
    assert result.first_divergent.startswith(first) and "elements differ (iteration 0)" in result.first_divergent
    assert {"recompute-mask", "gradient"} <= {m.oracle for m in result.mismatches}


def test_a_control_that_never_recomputes_is_named_too():
    result = run_module("examples.mlp:factory", impls.load("neg-no-recompute"))
    assert result.first_divergent == ("recompute draw 1 of 2 (aten::bernoulli_): "
                                      "the site was never recomputed (iteration 0)")


def test_wrap_selects_submodules_and_draws_outside_them_are_not_expected_to_recompute():
    result = run_module("examples.transformer_layer:factory", impls.load("neg-no-rewind"), wrap=["linear*"])
    assert result.checkpointed == ["linear1", "linear2"] and result.passed  # no draw inside: nothing to get wrong
    result = run_module("examples.transformer_layer:factory", impls.load("neg-no-rewind"), wrap=["dropout1"])
    assert result.first_divergent.startswith("recompute draw 1 of dropout1 (aten::bernoulli_)")


@pytest.mark.parametrize("factory", ["module_factories:tuple_factory", "module_factories:keyword_factory"])
def test_factories_may_return_a_tuple_or_keyword_inputs(factory):
    assert run_module(factory, impls.load("bundled"),
                      mode=Mode.REENTRANT if "tuple" in factory else Mode.NONREENTRANT).passed


@pytest.mark.parametrize("factory, wrap, message", [
    ("no_such_module:factory", None, "cannot import 'no_such_module' for factory"),
    ("module_factories:missing", None, "has no callable 'missing'"),
    ("module_factories", None, "expected package.module:factory"),
    ("module_factories:raising_factory", None, "raised RuntimeError: no weights here"),
    ("module_factories:wrong_factory", None, "returned str, expected a ModelCase or a tuple"),
    ("module_factories:nondeterministic_factory", None, "is not deterministic"),
    ("examples.mlp:factory", ["encoder*"], "--wrap 'encoder*' matches no submodule; paths: '', '0', '1'"),
])
def test_bad_input_is_one_line(factory, wrap, message):
    with pytest.raises(ModuleError, match=message.replace("(", r"\(").replace("*", r"\*")):
        run_module(factory, impls.load("bundled"), wrap=wrap)


def test_a_factory_that_takes_rng_tracker_gets_the_impls_tracker():
    # The model forks its own stream of the tracker it was built with: the bundled checkpoint
    # restores it for the recompute; torch's, which knows no tracker, recomputes with the stream
    # where the forward left it.
    assert run_module("module_factories:tracker_factory", impls.load("bundled")).passed
    result = run_module("module_factories:tracker_factory", impls.load("torch"))
    assert result.first_divergent.startswith("recompute draw 1 of drop (aten::bernoulli_): ")
    assert {"recompute-mask", "gradient"} <= {m.oracle for m in result.mismatches}


def test_a_factory_that_takes_rng_tracker_needs_an_impl_with_one():
    class Trackerless(BundledAdapter):
        def make_tracker(self, device):
            return None

    with pytest.raises(ModuleError, match="takes rng_tracker, but this impl has no RNG tracker"):
        run_module("module_factories:tracker_factory", Trackerless())


def test_a_model_that_does_not_reproduce_itself_is_not_judged(capsys):
    result = run_module("module_factories:unreproducible_factory", impls.load("bundled"))
    assert result.outcome == "skipped" and not result.passed
    assert re.search("cannot judge: .*not bit-reproducible here.*a second identical run differs", result.reason)
    assert main(["module", "module_factories:unreproducible_factory", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert out[0].endswith(": skipped") and out[1].startswith("cannot judge:")
    assert "none of its 1 selected cases ran" in captured.err


def test_the_command_line(tmp_path, capsys):
    report, script = tmp_path / "rep", tmp_path / "repro.py"
    status = main(["module", "examples.mlp:factory", "--impl", "neg-no-rewind", "--device", "cpu",
                   "--report-dir", str(report), "--script", str(script)])
    out = capsys.readouterr().out
    assert status == 1
    assert "first divergent draw: recompute draw 1 of 2 (aten::bernoulli_)" in out
    [record] = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert record["outcome"] == "mismatch" and record["verdict"] == "fail"
    assert record["first_divergent_draw"].startswith("recompute draw 1 of 2")
    assert record["case_id"] == "nonreentrant-module-eager-examples.mlp:factory-none-cpu"
    assert "First divergent draw: <code>recompute draw 1 of 2" in (report / "report.html").read_text()
    # The script repeats the run (it imports the factory), exit 1 while the divergence is there.
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr[-500:]
    assert "first divergent draw: recompute draw 1 of 2" in proc.stdout
    assert main(["module", "examples.mlp:factory", "--impl", "bundled", "--device", "cpu"]) == 0


def test_module_records_are_read_by_report_merge_and_compare(tmp_path, capsys):
    base, new, merged = tmp_path / "base", tmp_path / "new", tmp_path / "merged"
    assert main(["module", "examples.mlp:factory", "examples.transformer_layer:factory", "--impl", "bundled,torch",
                 "--mode", "nonreentrant,reentrant", "--device", "cpu", "--report-dir", str(base)]) == 0
    assert "8 runs: 8 pass" in capsys.readouterr().out
    assert main(["module", "examples.mlp:factory", "--impl", "neg-no-rewind", "--device", "cpu",
                 "--report-dir", str(new)]) == 1
    assert main(["report", str(base)]) == 0
    assert main(["merge", str(base), str(new), "--out", str(merged)]) == 0
    records = [json.loads(line) for line in (merged / "results.jsonl").read_text().splitlines()]
    assert len(records) == 9 and {r["kind"] for r in records} == {"module"}
    capsys.readouterr()
    assert main(["compare", str(base), str(merged)]) == 1  # a new failure: neg-no-rewind's run
    assert "python -m harness module examples.mlp:factory --impl neg-no-rewind" in (merged / "summary.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["module", "nope:factory"], "cannot import 'nope'"),
    (["module", "examples.mlp:factory", "--wrap", "x*"], "--wrap 'x*' matches no submodule"),
    (["module", "examples.mlp:factory", "--device", "cpu", "--capture", "single"],
     "--capture single needs --device cuda"),
    (["module", "examples.mlp:factory", "--iterations", "1"], "--iterations must be at least 2"),
])
def test_bad_input_on_the_command_line_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_impl_that_raises_is_reported_not_a_crash(capsys):
    assert main(["module", "examples.mlp:factory", "--impl", "faulty_adapters:make_raise", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert ": error\nerror: RuntimeError: faulty adapter: raised on purpose" in out


def test_keyword_arguments_reach_a_reentrant_checkpoint_bound_with_partial():
    # torch's reentrant checkpoint refuses keywords; transformers binds them with
    # functools.partial, and so do we.
    for impl in ("torch", "bundled"):
        result = run_module("module_factories:masked_factory", impls.load(impl), mode=Mode.REENTRANT, wrap=["inner"])
        assert result.passed, [m.message() for m in result.mismatches[:3]]
    result = run_module("module_factories:masked_factory", impls.load("neg-no-rewind"), mode=Mode.REENTRANT,
                        wrap=["inner"])
    assert result.first_divergent.startswith("recompute draw 1 of inner.drop (aten::bernoulli_)")


def test_a_difference_with_no_divergent_draw_is_diagnosed_as_rounding_not_rng(tmp_path, capsys):
    # nn.MultiheadAttention gets one tensor as query, key and value; a reentrant checkpoint takes
    # them as three inputs and sums their gradients in another order: every draw is right, the
    # input's gradient differs in its last bits.  Its own outcome, 'rounding': it passes unless
    # --rounding-fails, and says why.
    result = run_module("examples.transformer_layer:factory", impls.load("torch"), mode=Mode.REENTRANT,
                        wrap=["self_attn"])
    assert result.outcome == "rounding" and result.passed and result.first_divergent is None
    assert {m.oracle for m in result.mismatches} == {"gradient"}
    assert result.diagnosis.startswith("no RNG draw differs and every stream ends where the reference's does: ")
    assert "Rounding-sized (each within 1024 eps of its tensor's largest magnitude), not RNG" in result.diagnosis
    summary_text = summary("examples.transformer_layer:factory", "torch", "cpu", Capture.EAGER, Mode.REENTRANT, result)
    assert "first divergent draw" not in summary_text and "Rounding-sized" in summary_text
    argv = ["module", "examples.transformer_layer:factory", "--impl", "torch", "--device", "cpu", "--mode",
            "reentrant", "--wrap", "self_attn"]
    assert main(argv + ["--report-dir", str(tmp_path / "r")]) == 0
    [record] = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert (record["outcome"], record["verdict"]) == ("rounding", "pass")
    assert main(argv + ["--rounding-fails"]) == 1  # the negative control: the same run, counted as a failure
    assert ": rounding" in capsys.readouterr().out


def test_rounding_needs_every_difference_small_and_no_rng_oracle():
    # the same run, one gradient pushed far off: no longer rounding; an RNG oracle: never rounding
    from harness.check.records import MaskLog, RunRecord
    from harness.results import Mismatch
    from harness.run.draws import rounding_only

    ref, ck = RunRecord(MaskLog()), RunRecord(MaskLog())
    ref.grads[0] = {"w": torch.tensor([1.0, 2.0, 3.0])}
    ck.grads[0] = {"w": torch.tensor([1.0, 2.0, 3.0]).nextafter(torch.tensor(9.0))}
    one = [Mismatch("gradient", "w", 0, 3, 3)]
    assert rounding_only(one, ref, ck)
    ck.grads[0]["w"] = torch.tensor([1.0, 2.0, 4.0])
    assert not rounding_only(one, ref, ck)
    ck.grads[0]["w"] = ref.grads[0]["w"].nextafter(torch.tensor(9.0))
    assert not rounding_only(one + [Mismatch("recompute-mask", "s0", 0, 1, 4)], ref, ck)
    assert not rounding_only([], ref, ck)


def test_a_gradient_of_cancelling_terms_is_measured_against_its_modules_gradients():
    # BART's key bias under reentrant checkpointing (H100, torch 2.11): softmax makes its gradient
    # zero up to rounding, so 5.8e-11 against -5.8e-11 is 2 x 10^7 eps of its own magnitude but a
    # few eps of the key weight's gradient, whose terms it sums.  Its own scale alone called the
    # run a mismatch; a bias off by as much as the weight's gradient is still no rounding.
    from harness.check.records import MaskLog, RunRecord
    from harness.results import Mismatch
    from harness.run.draws import rounding_only

    ref, ck = RunRecord(MaskLog()), RunRecord(MaskLog())
    weight = torch.full((4, 4), 1.2e-4)
    ref.grads[0] = {"param.attn.k_proj.weight": weight, "param.attn.k_proj.bias": torch.tensor([5.8e-11, 0.0]),
                    "param.other.bias": torch.tensor([1.0])}
    ck.grads[0] = {"param.attn.k_proj.weight": weight, "param.attn.k_proj.bias": torch.tensor([-5.8e-11, 0.0]),
                   "param.other.bias": torch.tensor([1.0])}
    bias = [Mismatch("gradient", "param.attn.k_proj.bias", 0, 1, 2)]
    assert rounding_only(bias, ref, ck)
    ck.grads[0]["param.attn.k_proj.bias"] = torch.tensor([1.2e-4, 0.0])
    assert not rounding_only(bias, ref, ck)


def test_torchs_warning_that_explains_an_error_is_shown(capsys):
    # A reentrant checkpoint over a whole model whose only input is integer token ids: no input
    # requires grad, torch warns so, and backward then fails.
    assert main(["module", "module_factories:token_ids_factory", "--impl", "torch", "--mode", "reentrant",
                 "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "error: RuntimeError: element 0 of tensors does not require grad" in out
    assert "torch warned: None of the inputs have requires_grad=True" in out


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine imports here")
def test_the_transformer_engine_example_is_one_line_where_te_does_not_import(capsys):
    assert main(["module", "examples.te_transformer_layer:factory", "--impl", "bundled", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raised ModuleNotFoundError: No module named 'transformer_engine'" in err[0]


class _StashingTorch(Adapter):
    """torch's non-reentrant checkpoint whose recompute hands back the forward's RNG outputs from
    the bundled checkpoint's stash (a dispatch mode) instead of redrawing, as `bundled` does
    under CUDA-graph capture."""

    name = "stash-test"

    def make_tracker(self, device):
        return None

    def checkpoint(self, fn, *args, reentrant, tracker, **kwargs):
        import contextlib

        from harness.checkpoint.stash import RNGStash

        stash = RNGStash()

        @contextlib.contextmanager
        def replaying():
            with stash.replay():
                yield

        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                                 context_fn=lambda: (stash, replaying()), **kwargs)


def test_draws_a_checkpoint_hands_back_from_a_stash_are_seen_in_the_recompute():
    # The stash is a dispatch mode entered inside the recompute: a log outside it would never see
    # the dropouts and call them never recomputed.  The log inside each wrapped forward does.
    result = run_module("examples.mlp:factory", _StashingTorch())
    assert result.passed, [m.message() for m in result.mismatches[:3]]


def test_backward_kernels_are_not_draws_and_dropout_is_recorded_by_its_mask():
    from harness.check.records import FORWARD, RECOMPUTE, MaskLog
    from harness.run.draws import DrawLog, rng_output

    log, stack = MaskLog(), []
    log.start(0)
    x = torch.ones(64)
    out = torch.ops.aten.native_dropout.default(x, 0.5, True)
    assert rng_output(torch.ops.aten.native_dropout.default, out) is out[1] and out[1].dtype == torch.bool
    with DrawLog(log, stack, [False]):
        log.phase = RECOMPUTE
        torch.rand(3)  # no submodule running in backward: a backward kernel, not a draw
        stack.append("drop")
        torch.rand(3)
        log.phase = FORWARD
        stack.clear()
        torch.rand(3)
    assert sorted((name, phase) for (_, name, phase) in log.masks) == [
        ("<module> (aten::rand)", FORWARD), ("drop (aten::rand)", RECOMPUTE)]


def test_fused_attention_draws_are_recorded_by_their_philox_seed_and_offset():
    from types import SimpleNamespace

    from harness.run.draws import rng_output

    returns = [SimpleNamespace(name=n) for n in ("output", "log_sumexp", "philox_seed", "philox_offset")]
    func = SimpleNamespace(_schema=SimpleNamespace(returns=returns))
    out = (torch.rand(2, 2), torch.rand(2), torch.tensor(7), torch.tensor(16))
    assert rng_output(func, out).tolist() == [7, 16]


def test_a_recompute_stopped_early_leaves_no_submodule_path_behind():
    # torch's non-reentrant recompute stops by raising inside a submodule's forward, whose forward
    # hook then never pops its path; a draw in backward after it must still not read as a
    # recompute's draw.
    result = run_module("module_factories:backward_draw_factory", impls.load("torch"))
    assert result.passed, [m.message() for m in result.mismatches[:3]]


# ------------------------------------------------------------------ --wrap patterns and counts


@pytest.mark.parametrize("pattern, paths", [
    ("", [""]),
    ("blocks.*", ["blocks.0", "blocks.1"]),  # the blocks, not their insides
    ("blocks.*.mlp", ["blocks.0.mlp", "blocks.1.mlp"]),
    ("**.mlp", ["blocks.0.mlp", "blocks.1.mlp"]),
    ("**.attn_dropout", ["blocks.0.attn_dropout", "blocks.1.attn_dropout"]),
    ("blocks.1.**", ["blocks.1", "blocks.1.qkv", "blocks.1.attn_dropout", "blocks.1.mlp", "blocks.1.mlp.0",
                     "blocks.1.mlp.1", "blocks.1.mlp.2", "blocks.1.dropout", "blocks.1.norm"]),
    ("bl*", ["blocks"]),
])
def test_wrap_patterns_match_whole_path_components(pattern, paths):
    from examples.own_checkpointing import factory
    from harness.run.module_run import wrapped_paths

    assert wrapped_paths(factory().module, [pattern]) == paths


def test_the_count_is_draws_per_forward_at_sites():
    # Layer drop draws torch.rand([]) four times under one path: more draws than sites.
    from harness.fronts.module_report import summary as text

    result = run_module("examples.stochastic_depth:layer_drop", impls.load("bundled"), wrap=["layers.*"])
    # Iteration 0: the four rand draws and the dropouts of layers 1 and 3; sites: the rand and the
    # dropouts of the three layers that ran in one iteration or the other.
    assert (result.draws_per_forward, len(result.draws)) == (6, 4)
    line = text("x:y", "bundled", "cpu", Capture.EAGER, Mode.NONREENTRANT, result).splitlines()[1]
    assert line == ("wrapped: 'layers.0', 'layers.1', 'layers.2', 'layers.3'; "
                    "6 RNG draws per forward at 4 sites, 2 iterations")


# ------------------------------------------------------------------ the false failures, fixed


def test_drop_path_at_a_small_batch_is_not_stale_rng():
    # The second block's per-sample mask (batch 4) is all ones in both iterations, in the
    # reference too: chance, not stale RNG.  Before, every correct checkpoint failed it.
    from harness.check.records import FORWARD

    session_masks = []
    for impl in ("bundled", "torch", "torch-sac-recompute"):
        result = run_module("examples.stochastic_depth:drop_path", impls.load(impl), wrap=["blocks.*"])
        assert result.passed, (impl, [m.message() for m in result.mismatches[:3]])
    # The repeat really is in the model: the reference drew the same mask twice.
    from harness.fronts.module_mode import load_factory
    from harness.run.capture import execute
    from harness.run.module_run import ModuleSession, build, new_tracker

    dev = torch.device("cpu")
    tracker = new_tracker(impls.load("bundled"), dev)
    made = build(load_factory("examples.stochastic_depth:drop_path"), "x", dev, tracker)
    session = ModuleSession(made, tracker, dev, impls.load("bundled"), Mode.NONREENTRANT, [])
    execute(Capture.EAGER, session, 2)
    session_masks = [session.record.draws(it, "blocks.1 (aten::bernoulli_)", FORWARD)[0] for it in (0, 1)]
    assert torch.equal(*session_masks)
    # A checkpoint that really replays stale RNG is still caught (its forward masks differ too).
    result = run_module("examples.stochastic_depth:drop_path", impls.load("neg-stale-rng"), wrap=["blocks.*"])
    assert not result.passed


def test_layer_drop_a_layer_skipped_in_an_iteration_need_not_be_recomputed_there():
    # Layer 3 runs in iteration 0 and is skipped in iteration 1 (reference and checkpointed run
    # alike); layer 0 runs only in iteration 1.  Before, every correct checkpoint failed with
    # 'never recomputed', and layer 0's recompute was never checked.
    for impl in ("bundled", "torch"):
        result = run_module("examples.stochastic_depth:layer_drop", impls.load(impl), wrap=["layers.*"])
        assert result.passed, (impl, [m.message() for m in result.mismatches[:3]])
    result = run_module("examples.stochastic_depth:layer_drop", impls.load("neg-no-rewind"), wrap=["layers.*"])
    assert result.first_divergent.startswith("recompute draw 1 of layers.1.2 (aten::bernoulli_)")
    assert any(m.subject.startswith("layers.0.2") and m.iteration == 1 for m in result.mismatches)


def test_buffers_are_compared_batch_norm_updated_again_by_the_recompute():
    for impl in ("bundled", "torch"):
        result = run_module("examples.stochastic_depth:batch_norm", impls.load(impl), wrap=["blocks.*"])
        assert result.outcome == "mismatch" and {m.oracle for m in result.mismatches} == {"buffer"}
        subjects = {m.subject for m in result.mismatches}
        assert {"blocks.0.norm.num_batches_tracked", "blocks.0.norm.running_mean"} <= subjects
        assert (result.first_divergent is None
                and "Module state: the recompute updated buffers again" in result.diagnosis)
    # Without checkpointing inside a BatchNorm (wrapping only the linear layers) it passes.
    assert run_module("examples.stochastic_depth:batch_norm", impls.load("torch"), wrap=["blocks.*.linear"]).passed


# ------------------------------------------------------------------ the model's own checkpointing


@pytest.mark.parametrize("factory", ["factory", "reentrant", "timm_style"])
def test_as_built_judges_the_models_own_checkpointing(factory):
    result = run_module(f"examples.own_checkpointing:{factory}", AsBuilt())
    assert result.passed, [m.message() for m in result.mismatches[:3]]
    assert result.checkpointed == ["blocks.0", "blocks.1"]  # found by their recompute: forward run in backward


def test_as_built_catches_preserve_rng_state_false_at_its_first_draw():
    result = run_module("examples.own_checkpointing:no_rng_state", AsBuilt())
    assert result.outcome == "mismatch"
    assert result.first_divergent.startswith("recompute draw 1 of blocks.0.attn_dropout (aten::bernoulli_): ")
    assert {"recompute-mask", "gradient"} <= {m.oracle for m in result.mismatches}


def test_as_built_bad_input_and_a_model_that_recomputed_nothing(capsys):
    with pytest.raises(ModuleError, match="needs a factory with a parameter 'checkpointing'"):
        run_module("examples.mlp:factory", AsBuilt())
    result = run_module("module_factories:never_checkpointing", AsBuilt())
    assert result.outcome == "skipped" and "recomputed no submodule in backward" in result.reason
    assert main(["module", "examples.mlp:factory", "--impl", "as-built", "--wrap", "0"]) == 2
    assert "checkpoints what the model itself does" in capsys.readouterr().err


# ------------------------------------------------------------------ declared limits


def test_an_impls_declared_limit_is_unsupported_with_its_reason(capsys):
    result = run_module("examples.mlp:factory", impls.load("torch-sac-recompute"), mode=Mode.REENTRANT)
    assert result.outcome == "unsupported" and "for use_reentrant=False only" in result.reason
    assert main(["module", "examples.mlp:factory", "--impl", "torch-sac-recompute", "--mode", "reentrant",
                 "--device", "cpu"]) == 1  # nothing was judged
    captured = capsys.readouterr()
    assert (": unsupported\nselective checkpointing" in captured.out
            and "none of its 1 selected cases ran" in captured.err)
    # An impl that must run everything and declares no limit for the model: a failure.
    assert main(["module", "examples.mlp:factory", "--impl", "faulty_adapters:make_bundled_declining_all",
                 "--device", "cpu"]) == 1


def test_the_case_an_impl_is_asked_about_says_what_the_model_drew(monkeypatch):
    from harness.checkpoint import rng
    from harness.impls.bundled import BundledAdapter
    from harness.model.programs import Op, Passing
    from harness.run.module_run import module_case

    draws = ["layers.0.self_attn (aten::_scaled_dot_product_efficient_attention)", "drop (aten::native_dropout)",
             "<module> (aten::rand)", "x (aten::something_else)"]
    case = module_case(Mode.NONREENTRANT, Capture.SEPARATE, torch.device("cuda"), draws, keyword=True, tracked=False)
    assert case.program.ops() == {Op.SDPA_EFFICIENT, Op.NATIVE_DROPOUT, Op.RAND}
    assert case.program.passings() == {Passing.KEYWORD}
    monkeypatch.setattr(rng, "philox_available", lambda: False)  # the stash's limits (a torch < 2.14)
    assert "memory-efficient attention" in BundledAdapter().limit(case)
    eager = module_case(Mode.NONREENTRANT, Capture.EAGER, torch.device("cuda"), draws, keyword=False, tracked=True)
    assert BundledAdapter().limit(eager) is None and eager.layout.value == "mixed"
    nothing = module_case(Mode.REENTRANT, Capture.EAGER, torch.device("cpu"), [], keyword=False, tracked=False)
    assert nothing.program.ops() == {Op.DROPOUT_P0}


def test_a_model_that_raises_without_checkpointing_is_not_the_impls_error():
    # The reference runs no checkpoint of the impl's: its error cannot be the checkpoint's.
    result = run_module("module_factories:raising_forward_factory", impls.load("bundled"))
    assert result.outcome == "skipped"
    assert result.reason.startswith("cannot judge: the model without checkpointing raised under eager capture")
    assert "ValueError: this model raises" in result.reason
    # the reason names the frame it raised in, past torch's frames that only passed the call on
    assert "(raised in module_factories.py:" in result.reason and " (forward): the model's own code" in result.reason
    # where it raised is kept (the record's traceback): the line alone does not say whose code it was
    assert 'module_factories.py", line' in result.traceback and "in forward" in result.traceback


def test_raised_in_names_the_innermost_frame_outside_torch_and_the_standard_library():
    from harness.run.module_run import raised_in

    def model_code():
        # raised in torch's Python frames (Module.__call__, Linear.forward): the frame to name is
        # this one, which called them
        torch.nn.Linear(3, 4)(torch.ones(2, 5))

    try:
        model_code()
    except RuntimeError as exc:
        where = raised_in(exc)
    assert where.startswith("test_module_mode.py:") and where.endswith("(model_code)")
    try:
        import json
        json.loads("{")  # raised inside the standard library: the caller is named
    except ValueError as exc:
        assert raised_in(exc).endswith(
            "(test_raised_in_names_the_innermost_frame_outside_torch_and_the_standard_library)")


def test_a_model_with_no_rng_draw_is_nothing_to_judge_not_a_pass(capsys):
    # bits equal with nothing random drawn would be a pass that tested nothing
    result = run_module("module_factories:no_dropout_factory", impls.load("torch"))
    assert result.outcome == "skipped" and result.reason.startswith("nothing random to judge")
    assert main(["module", "module_factories:no_dropout_factory", "--impl", "torch", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert "nothing random to judge" in captured.out and "none of its 1 selected" in captured.err


# ------------------------------------------------------------------ layers that checkpoint a function


def test_a_layer_that_checkpoints_its_class_forward_function_is_seen_recomputed():
    # transformers 5.23's layers checkpoint their class's forward function through the instance's
    # _gradient_checkpointing_func: the recompute never calls the instance's forward.  The layers
    # are still the checkpointed submodules, and a draw of the layer's own is checked for its redraw.
    result = run_module("module_factories:function_checkpointing", AsBuilt())
    assert result.passed, [m.message() for m in result.mismatches[:3]]
    assert result.checkpointed == ["layers.0", "layers.1"]
    result = run_module("module_factories:function_checkpointing_no_rng_state", AsBuilt())
    assert result.outcome == "mismatch"
    assert result.first_divergent.startswith("recompute draw 1 of layers.0 (aten::bernoulli_): ")


# ------------------------------------------------------------------ transformers' checkpointing APIs


class _OldModel(torch.nn.Module):
    """A model with transformers' old method only (before 5.23)."""

    def __init__(self, options=True):
        super().__init__()
        self.calls = []
        if not options:
            self.gradient_checkpointing_enable = lambda gradient_checkpointing_kwargs=None: self.calls.append(
                ("old", gradient_checkpointing_kwargs))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, every_n_layers=1, offload=False):
        self.calls.append(("old", gradient_checkpointing_kwargs, every_n_layers, offload))


class _NewModel(_OldModel):
    """A model with 5.23's method beside the deprecated one."""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, every_n_layers=1, offload=False):
        self.calls.append(("new", activation_checkpointing_kwargs, every_n_layers, offload))

    def _set_gradient_checkpointing(self, enable=True, gradient_checkpointing_func=None, every_n_layers=1):
        self.calls.append(("hook", enable, gradient_checkpointing_func))


def test_the_checkpointing_helper_calls_the_new_api_where_the_model_has_it():
    from harness.checkpoint import hf

    model = _NewModel()
    assert hf.enable_checkpointing(model, reentrant=True, every_n_layers=2, offload=True) == hf.ACTIVATION_API
    assert model.calls == [("new", {"use_reentrant": True}, 2, True)]  # the deprecated method is never called
    assert hf.used_api(model) == "activation_checkpointing_enable"
    model = _NewModel()
    assert hf.set_checkpoint_function(model, print) == "_set_gradient_checkpointing" == hf.used_api(model)
    assert model.calls == [("hook", True, print)]


def test_the_checkpointing_helper_calls_the_old_api_where_the_model_has_no_new_one():
    from harness.checkpoint import hf

    model = _OldModel()
    assert hf.enable_checkpointing(model) == hf.GRADIENT_API == hf.used_api(model)
    assert hf.enable_checkpointing(model, every_n_layers=3, offload=True) == hf.GRADIENT_API
    assert model.calls == [("old", {"use_reentrant": False}, 1, False), ("old", {"use_reentrant": False}, 3, True)]
    # an old method without the options: the defaults are not passed, anything else is a clear error
    model = _OldModel(options=False)
    hf.enable_checkpointing(model)
    assert model.calls == [("old", {"use_reentrant": False})]
    with pytest.raises(TypeError, match="gradient_checkpointing_enable takes no every_n_layers or offload"):
        hf.enable_checkpointing(model, every_n_layers=2, offload=True)
    assert hf.used_api(torch.nn.Linear(2, 2)) == "" and hf.transformers_version(torch.nn.Linear(2, 2)) == ""


# -- what users mistype (issue 59): a container with no forward, compiled impls, the console script


@pytest.mark.parametrize("impl", ["torch", "bundled"])
def test_a_wrap_that_selects_only_a_container_that_never_runs_is_bad_input_not_the_checkpoints_fault(impl):
    # A ModuleList has no forward: its children run one by one, so wrapping it checkpoints nothing,
    # and a correct checkpoint would have failed with "never recomputed".  (A layer that layer drop
    # skipped in the reference is no container: it stays wrapped, test_the_count_is_draws_per_forward_at_sites.)
    with pytest.raises(ModuleError, match=r"--wrap 'layers' selects 'layers' \(ModuleList\), which has no forward of "
                                          r"its own.*wrap what runs, e\.g\. --wrap 'layers\.\*'"):
        run_module("module_factories:function_checkpointing", impls.load(impl), wrap=["layers"])
    assert run_module("module_factories:function_checkpointing", impls.load(impl), wrap=["layers.*"]).passed


def test_a_pattern_that_also_selects_what_runs_leaves_the_container_out_and_says_so():
    result = run_module("module_factories:function_checkpointing", impls.load("torch"), wrap=["**"])
    assert result.passed and "layers" not in result.checkpointed and result.not_wrapped == ["layers"]
    text = summary("module_factories:function_checkpointing", "torch", "cpu", Capture.EAGER, Mode.NONREENTRANT,
                   result)
    assert "not wrapped: 'layers' (matched by --wrap, but containers with no forward of their own" in text


def test_nested_wrapped_submodules_are_a_nested_case_an_impl_may_decline():
    # '**' wraps a module inside another: torch_remat cannot nest its regions, so it declares the
    # run unsupported (as the matrix says for nested programs) instead of raising an error
    pytest.importorskip("torch_remat")
    result = run_module("module_factories:function_checkpointing", impls.load("remat-hook"), wrap=["**"])
    assert result.outcome == "unsupported" and "nested" in result.reason


NO_REGION_BUDGET = pytest.mark.skipif(not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
                                      reason="this torch has no regional budget (the impl cannot load)")


@pytest.mark.parametrize("impl", ["torch-compile", "torch-compile-budget",
                                  pytest.param("torch-region-budget", marks=NO_REGION_BUDGET)])
def test_impls_that_compile_the_program_are_refused_in_module_mode_in_one_line(impl, capsys):
    assert main(["module", "examples.mlp:factory", "--impl", impl]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --impl {impl} checkpoints by compiling the program") and "\n" not in err


def test_the_console_script_imports_a_factory_from_the_current_folder(tmp_path):
    import shutil

    script = shutil.which("ckpt-harness")
    if script is None:
        pytest.skip("the ckpt-harness console script is not installed here (pip install -e . makes it)")
    (tmp_path / "mymodel.py").write_text((ROOT / "examples" / "mlp.py").read_text())
    proc = subprocess.run([script, "module", "mymodel:factory", "--impl", "bundled"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # a hang guard, not a speed test
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("bundled mymodel:factory (cpu, eager, nonreentrant): pass")
