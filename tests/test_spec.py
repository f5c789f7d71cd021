"""Program specs (`harness.model.spec`): they round-trip, named programs have one that runs the same, bad
ones are one line, and the case rules read every site and region of a spec program."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from harness.check import oracles
from harness.fronts import fuzz
from harness.impls import load
from harness.model.cases import CaseError, Device, parse_case_id
from harness.model.matrix import generate
from harness.model.programs import Dtype, Op, Passing, ProgramError, Shape, format_spec
from harness.model.spec import SpecProgram, parse_program, parse_spec
from harness.run.runner import _execute
from harness.run.workload import RunNames, Tensors

EXAMPLE = "bf16.odd.x3:list(rand@t+dropout.f32+keyword(randn@a))+bernoulli_@b+autocast(uniform_)"


def test_a_spec_reads_as_its_docstring_says():
    program = parse_spec(EXAMPLE)
    assert (program.dtype, program.shape, program.iterations) == (Dtype.BF16, Shape.ODD, 3)
    assert [(s.name, s.op, s.dtype, s.stream) for s in program.sites()] == [
        ("s0", Op.RAND, Dtype.BF16, "t"), ("s1", Op.DROPOUT, Dtype.F32, None), ("s2", Op.RANDN, Dtype.BF16, "a"),
        ("s3", Op.BERNOULLI, Dtype.BF16, "b"), ("s4", Op.UNIFORM, Dtype.BF16, None),
    ]
    assert [(r.name, r.passing) for r in program.all_regions()] == [
        ("r0", Passing.LIST), ("r1", Passing.KEYWORD), ("r2", Passing.AUTOCAST)]
    assert [s.name for s in program.checkpointed_sites()] == ["s0", "s1", "s2", "s4"]  # s3 is between regions
    assert program.spec == EXAMPLE and parse_spec(program.spec) == program


@pytest.mark.parametrize("text, canonical", [
    (" ( rand + ( randn ) ) ", "(rand+(randn))"),
    ("f32.small.x2:positional(native_dropout.f32)", "(native_dropout)"),
    ("x3.odd.f16:(rand)", "f16.odd.x3:(rand)"),
])
def test_spacing_defaults_and_header_order_are_not_part_of_the_canonical_spec(text, canonical):
    assert parse_spec(text).spec == canonical


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz.case_strategy(Device.CUDA))
def test_every_generated_program_and_case_id_round_trips(case):
    program = case.program
    assert parse_spec(format_spec(program)) == program
    assert parse_case_id(case.id) == case


def _named_programs():
    cases = list(generate(device="cuda")) + list(generate(device="cpu"))
    return sorted({case.program.name: case.program for case in cases}.values(), key=lambda p: p.name)


def test_every_named_program_has_a_spec_with_the_same_tree():
    for program in _named_programs():
        spec = parse_spec(program.spec)
        assert isinstance(spec, SpecProgram)
        assert spec.items() == program.items(), program.name
        assert (spec.dtype, spec.shape, spec.iterations) == (program.dtype, program.shape, program.iterations)
    assert parse_program("flat").spec == "(native_dropout+native_dropout)"


@pytest.mark.parametrize("name, layout", [
    ("nested", "mixed"), ("nodraw.f32.small.closure.siblings", "shared"),
    ("rand_like.bf16.odd.autocast.deep", "tracked"), ("sdpa_math.f32.small.sdpa_kernel.flat", "default"),
])
def test_a_named_programs_spec_runs_exactly_as_the_named_program(name, layout):
    """The reference runs of both (same streams, weights, masks, gradients, states) are equal."""
    named = parse_case_id(f"nonreentrant-{layout}-eager-{name}-draws-cpu")
    spec = parse_case_id(f"nonreentrant-{layout}-eager-{parse_program(name).spec}-draws-cpu")
    device = torch.device("cpu")
    bundled = load("bundled")
    records = []
    for case in (named, spec):
        records.append(_execute(case, 2, None, device, Tensors.make(case, device), bundled.make_tracker, None))
    first, second = records
    # (no checkpointed sites: a reference recomputes nothing)
    assert oracles.check(first, second, [], 2, RunNames.of(named).outputs, drawing=[]) == []
    assert first.log.masks.keys() == second.log.masks.keys()


@pytest.mark.parametrize("text, message", [
    ("(rand", "expected '+', '&' or ')' at column 6"),
    ("rand)", "expected '+', '&' or the end at column 5"),
    ("(rand,dropout)", "expected '+', '&' or ')' at column 6"),
    ("x1:(rand)", "unknown header option 'x1'"),
    ("(foo)", "unknown op 'foo'"),
    ("(rand@q)", "unknown stream 'q'"),
    ("(rand.f64)", "unknown dtype 'f64'"),
    ("lst(rand)", "unknown passing 'lst'"),
    ("", "no sites or regions"),
    ("keyword()", "expected a site or a region at column 9"),
])
def test_a_bad_spec_is_one_line_naming_the_problem(text, message):
    with pytest.raises(ProgramError, match="bad program spec") as info:
        parse_spec(text)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("case_id, reason", [
    ("reentrant-default-eager-(rand@t)-none-cpu", "draws from t: the case's layout must name what its sites do"),
    ("reentrant-untracked-eager-(rand@a)-none-cpu", "draws from a"),
    ("reentrant-mixed-eager-(rand)-none-cpu", "the mixed layout needs sites drawing from both d and t"),
    ("reentrant-shared-eager-(rand@d+rand@t)-none-cpu", "the shared layout needs a site drawing from a or b"),
    ("reentrant-default-eager-rand+randn-none-cpu", "a program needs a checkpointed region"),
    ("reentrant-default-eager-(closure(rand))-none-cpu", "a reentrant checkpoint differentiates only"),
    ("nonreentrant-default-eager-sdpa_kernel(rand)-none-cpu",
     "the sdpa_kernel context only matters to an attention op"),
    ("nonreentrant-default-eager-sdpa_kernel(sdpa_math+sdpa_efficient.f16)-none-cuda", "region r0 chooses sdpa_math's"),
    ("nonreentrant-default-eager-(sdpa_flash)-none-cuda", "sdpa_flash has no float32 kernel"),
    # sdpa_auto chooses no backend of its own inside the region: flash is all it may use (H200 fuzz)
    ("reentrant-default-eager-(sdpa_kernel(sdpa_auto+sdpa_flash.bf16))-none-cuda",
     "an sdpa_auto site runs on the backend its sdpa_kernel region chooses, and sdpa_flash has no float32"),
    ("nonreentrant-default-eager-(rand)-none-gpu", "unknown device"),
])
def test_the_rules_refuse_an_invalid_spec_case_with_its_reason(case_id, reason):
    with pytest.raises(CaseError) as info:
        parse_case_id(case_id)
    assert reason in str(info.value)


def test_a_spec_program_selects_every_valid_cell_of_it():
    cells = list(generate(program="(rand+rand)", device="cpu"))
    # 2 modes x 5 layouts x 2 interleaves on the CPU (eager only)
    assert len(cells) == 20 and {c.program.spec for c in cells} == {"(rand+rand)"}
    only_tracked = list(generate(program="(rand@t)", device="cpu"))
    assert {c.layout.value for c in only_tracked} == {"tracked"}


def test_a_spec_program_lacks_the_factors_it_varies():
    case = parse_case_id("nonreentrant-shared-eager-" + EXAMPLE + "-draws-cpu")
    values = case.axis_values()
    assert (values["op"], values["passing"], values["nesting"]) == ("", "", "")
    assert values["dtype"] == "bf16" and values["program"] == EXAMPLE
    assert parse_case_id("reentrant-default-eager-(rand+rand)-none-cpu").axis_values()["op"] == "rand"


def test_a_spec_nested_too_deep_is_one_line_not_a_recursion_error():
    from harness.model.spec import MAX_DEPTH

    assert parse_spec("(" * MAX_DEPTH + "rand" + ")" * MAX_DEPTH)
    with pytest.raises(ProgramError, match=f"regions nested more than {MAX_DEPTH} deep"):
        parse_spec("(" * 500 + "rand" + ")" * 500)
