"""`repro`: the RNG timeline marks the first divergence, and `--script` writes a standalone
program that reproduces (or not) the same outcome with only torch (plus the impl)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.fronts import timeline
from harness.fronts.cli import main
from harness.fronts.repro_script import render
from harness.impls import load
from harness.model.cases import parse_case_id
from harness.run.runner import run

ROOT = Path(__file__).resolve().parent.parent


def run_script(tmp_path, case_id: str, impl: str) -> subprocess.CompletedProcess:
    """Write the standalone script of `case_id` for `impl` into `tmp_path` and run it there."""
    script = tmp_path / "repro.py"
    script.write_text(render(parse_case_id(case_id), impl))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)


def first_divergence(impl: str, case_id: str):
    result = run(parse_case_id(case_id), load(impl), timeline=True)
    rows = timeline.rows(result.timelines["reference"], result.timelines["checkpointed"])
    return next((r for r in rows if r[""] == "<-- first divergence"), None)


def test_torch_diverges_where_the_recompute_enters_with_the_tracked_stream_advanced():
    row = first_divergence("torch", "reentrant-tracked-eager-flat-none-cpu")
    assert (row["iteration"], row["step"], row["stream"]) == (0, "recompute r0 entry", "tracker:model-parallel-rng")


def test_no_restore_diverges_after_backward_on_the_default_stream():
    row = first_divergence("neg-no-restore", "reentrant-default-eager-flat-draws-cpu")
    assert (row["iteration"], row["step"], row["stream"]) == (0, "after backward", "cpu")


def test_bundled_has_no_divergence():
    assert first_divergence("bundled", "nonreentrant-shared-eager-nested-draws-cpu") is None


@pytest.mark.parametrize(
    "impl, case_id, status",
    [
        ("torch", "nonreentrant-tracked-eager-nested-draws-cpu", 1),
        ("torch", "reentrant-untracked-eager-siblings-draws-cpu", 0),
        ("bundled", "reentrant-shared-eager-nested-draws-cpu", 0),
        ("neg-no-restore", "reentrant-mixed-eager-siblings-none-cpu", 1),
        ("neg-live-handles", "nonreentrant-default-eager-flat-none-cpu", 1),
        # region programs: every passing and nesting, each dtype and shape, several ops
        ("bundled", "nonreentrant-mixed-eager-dropout_inplace.bf16.odd.keyword.deep-draws-cpu", 0),
        ("bundled", "reentrant-shared-eager-randint.f16.large.dict.wide-none-cpu", 0),
        ("bundled", "reentrant-tracked-eager-sdpa_math.f32.small.sdpa_kernel.nested-draws-cpu", 0),
        ("bundled", "nonreentrant-default-eager-nodraw.f32.small.closure.siblings-none-cpu", 0),
        ("torch", "nonreentrant-tracked-eager-multinomial.f32.odd.list.flat-none-cpu", 1),
        ("torch", "reentrant-mixed-eager-randperm.bf16.small.autocast.flat-draws-cpu", 1),
        ("neg-no-rewind", "nonreentrant-untracked-eager-bernoulli_.f16.small.positional.wide-none-cpu", 1),
        ("torch", "reentrant-untracked-eager-rand.f32.small.keyword.flat-none-cpu", 1),  # torch raises
        # spec programs: per-site ops, dtypes and streams, sites between regions, 3 and 4 iterations
        ("bundled", "nonreentrant-shared-eager-bf16.odd.x3:list(rand@t+dropout.f32+keyword(randn@a))+bernoulli_@b+"
                    "autocast(uniform_)-draws-cpu", 0),
        ("torch", "nonreentrant-mixed-eager-x4:(native_dropout@d+(randperm.f16@t))-none-cpu", 1),
        ("neg-two-slots", "reentrant-default-eager-(native_dropout+((native_dropout)))-none-cpu", 1),
        ("torch", "nonreentrant-default-eager-f16:normal_+closure(multinomial+sdpa_kernel(sdpa_math))+rand-"
                  "draws-cpu", 0),
        # issue 29's structures: one tensor feeding two regions, passed twice, a third iteration,
        # attention that pins no backend
        ("bundled", "nonreentrant-tracked-eager-(native_dropout)&(native_dropout)-draws-cpu", 0),
        ("neg-id-pool", "reentrant-default-eager-(native_dropout)&(native_dropout)-none-cpu", 1),
        ("bundled", "reentrant-shared-eager-twice(native_dropout+native_dropout)-draws-cpu", 0),
        ("neg-stale-third-step", "nonreentrant-untracked-eager-x3:(native_dropout+(native_dropout))-none-cpu", 1),
        ("bundled", "nonreentrant-default-eager-(native_dropout&native_dropout)+sdpa_auto-draws-cpu", 0),
        ("neg-leak-sdpa", "nonreentrant-default-eager-(native_dropout+native_dropout)+sdpa_auto-none-cpu", 1),
    ],
)
def test_the_standalone_script_agrees_with_the_harness(tmp_path, impl, case_id, status):
    assert (run(parse_case_id(case_id), load(impl)).outcome.value == "pass") == (status == 0)
    proc = run_script(tmp_path, case_id, impl)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert ("mismatches" in proc.stdout or "the checkpointed run raised" in proc.stdout) == (status == 1)


def test_the_torch_script_needs_nothing_but_torch():
    source = render(parse_case_id("reentrant-tracked-eager-flat-none-cpu"), "torch")
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"contextlib", "sys", "torch"}


def test_repro_command_prints_the_timeline_and_writes_the_script(tmp_path, capsys):
    script = tmp_path / "r.py"
    assert main(["repro", "reentrant-tracked-eager-flat-none-cpu", "--impl", "torch", "--script", str(script)]) == 1
    out = capsys.readouterr().out
    assert "RNG timeline, reference vs checkpointed" in out and "<-- first divergence" in out
    assert script.read_text().startswith("#!/usr/bin/env python3")


def test_a_script_whose_setup_fails_exits_2_not_1(tmp_path):
    proc = run_script(tmp_path, "reentrant-default-eager-flat-none-cpu", "no-such-impl")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown implementation 'no-such-impl'" in proc.stderr


def test_the_script_checks_region_outputs_and_prints_values_as_the_harness_does(tmp_path):
    # neg-wrong-output changes one element of each region's output and nothing else: only the
    # output oracle sees it, so a script without it would pass what `repro` fails
    case_id = "reentrant-default-eager-flat-none-cpu"
    result = run(parse_case_id(case_id), load("neg-wrong-output"))
    assert {m.oracle for m in result.mismatches} == {"output"}
    proc = run_script(tmp_path, case_id, "neg-wrong-output")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "output r0 iteration 0: Mismatched elements: 1 / 4096" in proc.stdout
    # float values as value and bits, like the harness's messages (not raw integers)
    assert " (0x" in proc.stdout.split("output r0 iteration 0")[1].splitlines()[0]


@pytest.mark.parametrize("impl, case_id, line", [
    # a tracker whose fork() does nothing: every tracked comparison would be vacuous
    ("neg-inert-fork", "nonreentrant-tracked-eager-flat-none-cpu",
     "reference check failed: tracker fork('model-parallel-rng') did not switch streams: site s0 left "
     "'model-parallel-rng' where it was (+"),
])
def test_the_script_checks_the_reference_as_the_harness_does(tmp_path, impl, case_id, line):
    result = run(parse_case_id(case_id), load(impl))
    assert result.outcome.value == "error" and "reference check failed" in result.error
    proc = run_script(tmp_path, case_id, impl)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # a broken reference, not a reproduced mismatch
    assert line in proc.stdout


def _template_namespace() -> dict:
    """The standalone script's template as a module (its main() only runs as __main__)."""
    source = (Path(__file__).parents[1] / "harness" / "fronts" / "repro_template.py").read_text()
    namespace: dict = {"__name__": "repro_template"}
    exec(compile(source, "repro_template.py", "exec"), namespace)  # noqa: S102 - our own file
    return namespace


def test_the_scripts_op_table_is_the_registry_op_for_op():
    # The script carries its own copy of every op (it needs nothing but torch): each must draw and
    # pass on exactly what the harness's registry entry does, or a script would reproduce another case.
    import torch

    from harness.check.compare import int_view
    from harness.model import ops
    from harness.model.programs import NO_DRAW_OPS, SDPA_OPS, Op

    template = _template_namespace()
    assert template["P"] == ops.DROPOUT_P
    assert set(template["OPS"]) | {op.value for op in SDPA_OPS} == {op.value for op in Op}
    assert set(template["DRAW_NOTHING"]) == {op.value for op in NO_DRAW_OPS} == {
        op.value for op, spec in ops.REGISTRY.items() if not spec.draws}
    compared = []
    for op, spec in ops.REGISTRY.items():
        if spec.cuda_only:
            continue  # the attention kernels without a CPU version: the GPU runs of the scripts cover them
        h = torch.randn(64, 64, generator=torch.Generator().manual_seed(7))
        torch.manual_seed(1234)
        expected = spec.apply(h.clone(), True)
        torch.manual_seed(1234)
        got = (template["OPS"][op.value] if op.value in template["OPS"]
               else template["attention"](op.value, True))(h.clone())
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape and torch.equal(int_view(g), int_view(e)), op
        compared.append(op)
    assert len(compared) >= len(ops.REGISTRY) - len(SDPA_OPS)
