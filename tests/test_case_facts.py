"""Facts about what a case does (harness/model/case_facts.py), and expectation entries that name them:
one entry covers a named program and every spec program with the same property."""

from __future__ import annotations

import pytest
from machines import h200_torch_2_11

from harness.model.case_facts import facts_of
from harness.model.cases import parse_case_id
from harness.verdict import expectations


def facts(case_id):
    found = facts_of(parse_case_id(case_id))
    return {**{k: sorted(v) for k, v in found.values.items()}, **found.flags, **found.counts}


def test_where_ops_are_drawn_and_how_regions_are_entered():
    got = facts("reentrant-mixed-eager-list(native_dropout@t+keyword(rand@d))+bernoulli_@d-none-cpu")
    assert got["passing"] == ["keyword", "list"]
    assert got["op_in_region"] == ["native_dropout", "rand"] and got["op_outside"] == ["bernoulli_"]
    assert got["op_nested"] == ["rand"]
    assert got["after_region"] and got["nested"] and got["draws_outside"]
    assert got["tracked_in_region"] and got["default_in_region"] and got["draws_in_region"]
    assert got["regions_pending"] == 2


def test_named_programs_have_the_same_facts_as_their_specs():
    for nesting, pending in (("flat", 1), ("nested", 2), ("siblings", 2), ("deep", 3), ("wide", 3)):
        named = facts(f"nonreentrant-tracked-eager-{nesting}-none-cpu")
        program = parse_case_id(f"nonreentrant-tracked-eager-{nesting}-none-cpu").program
        spec = facts(f"nonreentrant-tracked-eager-{program.spec}-none-cpu")
        assert named == spec and named["regions_pending"] == pending


def test_sites_by_op_and_dtype():
    got = facts("nonreentrant-default-eager-bf16:(native_dropout+sdpa_kernel(sdpa_efficient.bf16))-none-cuda")
    assert got["site_in_region"] == ["native_dropout.bf16", "sdpa_efficient.bf16"]  # the header's dtype
    h200 = h200_torch_2_11()
    entry = expectations.find(expectations.load(), "torch",
                              "nonreentrant-default-eager-((native_dropout+native_dropout+sdpa_kernel(sdpa_efficient.bf16)))-none-cuda",
                              machine=h200)
    assert entry.label == "torch-sdpa-kernel-not-replayed"  # an H200 fuzzer finding: cuDNN is the H200's bf16 choice
    # memory-efficient is the H200's own choice for float32: the recompute runs the same backend
    assert expectations.find(expectations.load(), "torch",
                             "nonreentrant-default-eager-(sdpa_kernel(sdpa_efficient))-none-cuda", machine=h200) is None


def test_sites_under_sdpa_kernel_are_those_a_recompute_may_run_on_another_backend():
    # Inside the sdpa_kernel region and inside a region nested in it (its forward runs under the
    # context too); not a math site in the region around it, which selects its backend itself.
    got = facts("nonreentrant-default-eager-(sdpa_math+sdpa_kernel(sdpa_efficient+native_dropout"
                "+(sdpa_efficient.bf16)))-none-cuda")
    assert got["site_in_sdpa_kernel"] == ["native_dropout.f32", "sdpa_efficient.bf16", "sdpa_efficient.f32"]
    assert "sdpa_math.f32" in got["site_in_region"]
    # An H200 finding (torch 2.11, fuzz --new-only): a math site beside an sdpa_kernel region of
    # this GPU's default float32 backend passed; the entry claimed it by site_in_region and went stale.
    stale = ("nonreentrant-untracked-single-f16.x4:dict((sdpa_math@d&sdpa_kernel(sdpa_efficient.f32@d+poisson.f32@d)"
             "+twice(nodraw@d&rand+sdpa_efficient))+autocast((nodraw@d)))+(randint.f32)-none-cuda")
    assert expectations.find(expectations.load(), "torch", stale) is None


def test_a_region_that_draws_nothing_and_tracked_sites_outside_regions():
    assert not facts("nonreentrant-tracked-eager-(dropout_p0)-none-cpu")["draws_in_region"]
    assert not facts("nonreentrant-tracked-eager-(dropout_p0)-none-cpu")["tracked_in_region"]  # it draws nothing
    outside = facts("nonreentrant-mixed-eager-(native_dropout@d)+native_dropout@t-none-cpu")
    assert not outside["tracked_in_region"] and outside["draws_outside"] and outside["default_in_region"]


def test_what_a_selective_policy_saves_and_redraws():
    # a saved first op shifts what comes after it (the SAC save-list skew)
    got = facts("nonreentrant-default-eager-(sdpa_efficient+dropout)-none-cuda")
    assert got["op_before_draw"] == ["sdpa_efficient"] and got["first_draw_in_region"] == ["sdpa_efficient"]
    assert got["drawn_again_in_region"] and not got["fused_attention_only"]
    # the same op twice: a save list that keeps it keeps both, nothing is redrawn after it
    same = facts("nonreentrant-default-eager-sdpa_cudnn.f16.small.sdpa_kernel.flat-none-cuda")
    assert same["op_before_draw"] == [] and same["fused_attention_only"]
    # a site that draws nothing is no draw; an inner region's draws run inside its outer region
    assert not facts("nonreentrant-default-eager-nodraw.f32.small.positional.flat-none-cpu")["drawn_again_in_region"]
    assert facts("nonreentrant-default-eager-((native_dropout)+native_dropout)-none-cpu")["drawn_again_in_region"]
    assert not facts("nonreentrant-default-eager-((randn_like)+(rand_like))-none-cpu")["drawn_again_in_region"]
    # a later draw from another stream is not shifted by the first one, but a tracked one is redrawn
    # an inner region's draw before the outer region's last own site is rerun by the outer recompute
    inner_first = facts("nonreentrant-default-eager-((native_dropout+(native_dropout)+nodraw))-none-cpu")
    assert inner_first["drawn_again_in_region"]
    mixed = facts("nonreentrant-mixed-eager-(randn@d+native_dropout@t)-none-cpu")
    assert not mixed["drawn_again_in_region"] and mixed["tracked_after_draw"]
    assert not facts("nonreentrant-mixed-eager-(randn@t+native_dropout@d)-none-cpu")["tracked_after_draw"]
    assert facts("nonreentrant-default-eager-(rand_like+(bernoulli_))-none-cpu")["first_draw_in_region"] == [
        "bernoulli_", "rand_like"]  # the outer region's first, and the inner region's


def _entries(tmp_path, text):
    path = tmp_path / "e.toml"
    path.write_text(text)
    return expectations.load(path)


def test_one_entry_by_facts_matches_named_and_spec_programs_alike(tmp_path):
    [entry] = _entries(tmp_path, '[[expect]]\nimpl = "torch"\nname = "container"\nmode = "reentrant"\n'
                                 'passing = ["list", "dict"]\noutcome = ["error", "mismatch"]\n'
                                 'message = "^RuntimeError"\noracles = ["gradient"]\nreason = "r"\n')
    for case_id in ("reentrant-default-eager-native_dropout.f32.small.list.flat-none-cpu",
                    "reentrant-default-eager-list(native_dropout)-none-cpu",
                    "reentrant-tracked-eager-(dict(rand@t))+native_dropout@t-draws-cpu"):
        assert entry.matches("torch", case_id), case_id
    assert not entry.matches("torch", "nonreentrant-default-eager-list(native_dropout)-none-cpu")
    assert entry.misses("reentrant-default-eager-flat-none-cpu") == ["passing is positional, not dict or list"]
    # One bug, two ways to show: either explains the case, nothing else does.
    assert entry.explains("error", [], "RuntimeError: element 0 ...")
    assert entry.explains("mismatch", ["recompute-mask", "gradient"], "")
    assert not entry.explains("mismatch", ["live-stream"], "")
    assert not entry.explains("crash", [], "RuntimeError")
    assert entry.label == "container" and entry.expected() == "error matching '^RuntimeError' or mismatch (gradient)"


def test_unless_takes_cases_out_again(tmp_path):
    [entry] = _entries(tmp_path, '[[expect]]\nimpl = "torch"\ntracked_in_region = true\nreason = "r"\n'
                                 'unless = { mode = "reentrant", passing = ["keyword"] }\n')
    assert entry.matches("torch", "reentrant-tracked-eager-flat-none-cpu")
    assert entry.misses("reentrant-tracked-eager-keyword(native_dropout)-none-cpu") == [
        "unless mode=reentrant, passing=keyword holds"]
    assert entry.matches("torch", "nonreentrant-tracked-eager-keyword(native_dropout)-none-cpu")


def test_an_id_that_names_no_case_matches_pattern_entries_only(tmp_path):
    facts_entry, pattern_entry = _entries(
        tmp_path, '[[expect]]\nimpl = "x"\nmode = "reentrant"\nreason = "r"\n'
                  '[[expect]]\nimpl = "x"\ncases = ["*-module-*"]\nreason = "r"\n')
    module_id = "reentrant-module-eager-examples.mlp:factory-none-cpu"
    assert not facts_entry.matches("x", module_id) and pattern_entry.matches("x", module_id)


def test_conflicts_are_two_entries_claiming_one_case_with_different_failures(tmp_path):
    entries = _entries(tmp_path, '[[expect]]\nimpl = "torch"\nname = "a"\nmode = "reentrant"\nreason = "r"\n'
                                 '[[expect]]\nimpl = "torch"\nname = "b"\nlayout = "tracked"\n'
                                 'outcome = "error"\nreason = "r"\n'
                                 '[[expect]]\nimpl = "torch"\nname = "c"\nlayout = "tracked"\nreason = "r"\n')
    cases = [parse_case_id("reentrant-tracked-eager-flat-none-cpu"),
             parse_case_id("reentrant-default-eager-flat-none-cpu")]
    assert expectations.conflicts(entries, cases) == [
        "conflict: torch: a (mismatch) and b (error) both claim reentrant-tracked-eager-flat-none-cpu"]


def test_the_expectations_file_has_no_conflicts_on_the_default_matrices():
    from harness.model.matrix import generate

    assert expectations.conflicts(expectations.load(), list(generate())) == []  # cpu and cuda


@pytest.mark.parametrize("case_id, impl, label", [
    ("reentrant-default-eager-list(native_dropout)-none-cpu", "torch", "torch-reentrant-container"),
    ("reentrant-default-eager-(list(native_dropout)+native_dropout)-none-cpu", "torch", "torch-reentrant-container"),
    ("reentrant-mixed-eager-dict(native_dropout@t)+native_dropout@d-draws-cpu", "torch", "torch-reentrant-container"),
    ("nonreentrant-tracked-eager-(native_dropout)-none-cpu", "torch", "torch-ignores-tracker"),
    ("nonreentrant-tracked-eager-(dropout_p0)-none-cpu", "torch", None),  # draws nothing: no model claims it
    # H200 fuzzer findings of torch (--capture all): a keyword region under reentrant that draws
    # nothing still raises; a keyword region's default-stream site beside a tracked one outside.
    ("reentrant-default-eager-keyword(nodraw)-none-cuda", "torch", "torch-reentrant-keyword"),
    ("nonreentrant-mixed-eager-keyword(native_dropout)+native_dropout-none-cuda", "torch",
     "torch-keyword-closure-cuda-rng"),
    # Which of two errors comes first where SAC's policy saves RNG ops (H100, torch 2.11): the
    # enclosing region's recompute reruns the inner region under its sdpa_kernel context (its own
    # body enters it), so the cached in-place op's 'mutated' wins over 'not found in storage'.
    ("nonreentrant-default-eager-(sdpa_kernel(native_dropout+sdpa_math)+native_dropout+exponential_)-none-cuda",
     "torch-sac-save-rng", "sac-save-every-rng-op"),
    ("nonreentrant-default-eager-(sdpa_kernel(sdpa_math+native_dropout)+native_dropout+(exponential_))-none-cuda",
     "torch-sac-save-first-rng", "sac-save-list-rng-skew"),
])
def test_the_fuzzers_known_forms_are_claimed_by_their_bug(case_id, impl, label):
    found = expectations.find(expectations.load(), impl, case_id, machine=h200_torch_2_11())
    assert (found.label if found else None) == label


# Seen on the CPU (torch 2.13, torch-sac-save-rng): the error of the recompute that runs first.  An
# enclosing recompute stops early (its last own site, or the entry of an inner region whose input
# its frame holds) and reruns inner regions under their context: 'mutated' (an in-place RNG op's
# cached output, sdpa_math's on the CPU) where it reaches the inner sites, else the inner region's
# own recompute outside sdpa_kernel: 'not found in storage'.
@pytest.mark.parametrize("program, label", [
    ("(sdpa_kernel(sdpa_auto+sdpa_math))", "sac-sdpa-kernel-not-cached"),
    ("((sdpa_kernel(sdpa_auto+sdpa_math)))", "sac-sdpa-kernel-not-cached"),
    ("(native_dropout+(sdpa_kernel(sdpa_auto+sdpa_math)))", "sac-sdpa-kernel-not-cached"),
    ("(sdpa_kernel(sdpa_auto+sdpa_math)+exponential_)", "sac-save-every-rng-op"),
    ("((sdpa_kernel(sdpa_auto+sdpa_math))+native_dropout)", "sac-save-every-rng-op"),
    ("(exponential_+sdpa_kernel(sdpa_auto+sdpa_math))", "sac-save-every-rng-op"),
    ("(sdpa_kernel(sdpa_math+sdpa_auto))", "sac-save-every-rng-op"),
])
def test_the_first_recompute_to_raise_names_the_error(program, label):
    case_id = f"nonreentrant-default-eager-{program}-none-cpu"
    found = expectations.find(expectations.load(), "torch-sac-save-rng", case_id)
    assert (found.label if found else None) == label


def test_explain_names_the_match_and_why_the_others_miss(capsys):
    from harness.fronts.cli import main

    assert main(["expectations", "explain", "reentrant-default-eager-list(native_dropout)-none-cpu",
                 "--impl", "torch"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("torch reentrant-default-eager-list(native_dropout)-none-cpu: claimed by "
                             "torch-reentrant-container")
    assert "  why   the loss does not require grad: nothing after r0 (entered list) carries a gradient" in out
    assert ("  model torch-reentrant-keyword: refuses-input(passing=keyword) predicts a pass: its bug cannot show "
            "here") in out
    invisible = "  model torch-reentrant-container: input-invisible(passing=list|dict) predicts error"
    assert any(line.startswith(invisible) for line in out)
    assert main(["expectations", "conflicts", "--device", "cpu"]) == 0
    assert main(["expectations", "explain", "nope", "--impl", "torch"]) == 2

