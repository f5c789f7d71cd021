"""`python -m harness module`: your own model under test (harness/module_mode.py), on the CPU.

The examples under examples/ pass under `bundled` and `torch` and fail under a negative control,
with the first divergent RNG draw named; bad input is one line and exit status 2.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import impls
from harness.__main__ import main
from harness.cases import Mode
from harness.impls.base import Adapter
from harness.impls.bundled import BundledAdapter
from harness.module_mode import ModuleError, NotReproducible, run_module

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
    assert result.first_divergent == "recompute draw 1 of 2 (aten::bernoulli_): the site was never recomputed (iteration 0)"


def test_wrap_selects_submodules_and_draws_outside_them_are_not_expected_to_recompute():
    result = run_module("examples.transformer_layer:factory", impls.load("neg-no-rewind"), wrap=["linear*"])
    assert result.wrapped == ["linear1", "linear2"] and result.passed  # no draw inside: nothing to get wrong
    result = run_module("examples.transformer_layer:factory", impls.load("neg-no-rewind"), wrap=["dropout1"])
    assert result.first_divergent.startswith("recompute draw 1 of dropout1 (aten::bernoulli_)")


@pytest.mark.parametrize("factory", ["module_factories:tuple_factory", "module_factories:keyword_factory"])
def test_factories_may_return_a_tuple_or_keyword_inputs(factory):
    assert run_module(factory, impls.load("bundled"), mode=Mode.REENTRANT if "tuple" in factory else Mode.NONREENTRANT).passed


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
    with pytest.raises(NotReproducible, match="not bit-reproducible here.*a second identical run differs"):
        run_module("module_factories:unreproducible_factory", impls.load("bundled"))
    assert main(["module", "module_factories:unreproducible_factory", "--device", "cpu"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "cannot judge" in out[0]


def test_the_command_line(tmp_path, capsys):
    report, script = tmp_path / "rep", tmp_path / "repro.py"
    status = main(["module", "examples.mlp:factory", "--impl", "neg-no-rewind", "--device", "cpu",
                   "--report-dir", str(report), "--script", str(script)])
    out = capsys.readouterr().out
    assert status == 1
    assert "first divergent draw: recompute draw 1 of 2 (aten::bernoulli_)" in out
    data = json.loads((report / "result.json").read_text())
    assert data["outcome"] == "mismatch" and data["first_divergent_draw"].startswith("recompute draw 1 of 2")
    # The script repeats the run (it imports the factory), exit 1 while the divergence is there.
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr[-500:]
    assert "first divergent draw: recompute draw 1 of 2" in proc.stdout
    assert main(["module", "examples.mlp:factory", "--impl", "bundled", "--device", "cpu"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["module", "nope:factory"], "cannot import 'nope'"),
    (["module", "examples.mlp:factory", "--wrap", "x*"], "--wrap 'x*' matches no submodule"),
    (["module", "examples.mlp:factory", "--device", "cpu", "--capture", "single"], "--capture single needs --device cuda"),
    (["module", "examples.mlp:factory", "--iterations", "1"], "--iterations must be at least 2"),
])
def test_bad_input_on_the_command_line_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_impl_that_raises_is_reported_not_a_crash(capsys):
    assert main(["module", "examples.transformer_layer:factory", "--impl", "torch", "--mode", "reentrant",
                 "--wrap", "self_attn"]) == 1
    assert "error: ValueError: Unexpected keyword arguments" in capsys.readouterr().out



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
    from harness.module_mode import DrawLog, rng_output
    from harness.records import FORWARD, RECOMPUTE, MaskLog

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

    from harness.module_mode import rng_output

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
