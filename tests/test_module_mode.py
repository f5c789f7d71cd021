"""`python -m harness module`: your own model under test (harness/module_mode.py), on the CPU.

The examples under examples/ pass under `bundled` and `torch` and fail under a negative control,
with the first divergent RNG draw named; bad input is one line and exit status 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import impls
from harness.__main__ import main
from harness.cases import Mode
from harness.module_mode import ModuleError, run_module

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

