"""Case generation and case ids: counts, shell-safe ids, round trips, filters and user errors."""

from __future__ import annotations

import re

import pytest

from harness.model import corpus
from harness.model.cases import (
    AXES,
    Capture,
    Case,
    CaseError,
    Device,
    Interleave,
    Layout,
    Mode,
    Nesting,
    invalid_reason,
    parse_case_id,
    parse_value,
)
from harness.model.matrix import (
    CONTEXT_PARALLEL,
    PINNED,
    PINNED_CUDA,
    covering,
    generate,
    save_covering,
    structure_covering,
)
from harness.model.spec import parse_program

ID_PATTERN = re.compile(r"^[a-z0-9_.-]+$")
ALL_CASES = list(generate())
CLASSIC = "flat,nested,siblings"  # the first matrix's programs


def _values(axis: str) -> list[str]:
    return [member.value for member in AXES[axis]]


# --- counts -------------------------------------------------------------------------------------


def test_first_matrix_is_still_all_240_of_its_cases():
    assert len(list(generate(program=CLASSIC))) == 240
    assert len(list(generate(program=CLASSIC, device="cpu"))) == 60
    assert len(list(generate(program=CLASSIC, device="cuda"))) == 180


def test_default_matrix_is_the_first_matrix_plus_the_covering_programs_the_pinned_cases_and_the_corpus():
    for device, first in ((Device.CPU, 60), (Device.CUDA, 180)):
        ids = [c.id for c in generate(device=device)]
        pins = PINNED + CONTEXT_PARALLEL + (PINNED_CUDA if device is Device.CUDA else ())
        pinned = {f"{p}-{device.value}" for p in pins} - {c.id for c in covering(device)}
        found = {c.id for c in corpus.cases(device.value)} - {c.id for c in structure_covering(device)}
        assert len(ids) == (first + len(covering(device)) + len(structure_covering(device)) + len(save_covering(device))
                            + len(pinned) + len(found))
        assert pinned <= set(ids) and found <= set(ids)


def test_cpu_cases_are_all_eager():
    captures = {case.capture for case in generate(device="cpu")}
    assert captures == {Capture.EAGER}


def test_cuda_cases_cover_every_capture_mode():
    captures = {case.capture for case in generate(device="cuda")}
    assert captures == set(Capture)


def test_no_generated_case_is_invalid():
    assert [case.id for case in ALL_CASES if invalid_reason(case)] == []


# --- ids ----------------------------------------------------------------------------------------


def test_every_case_id_is_shell_safe():
    """Named programs give shell-safe ids; a spec program's id (the corpus, the structures) also
    has parentheses, '+', '&', '@' and ':' (quoted in every command line the harness prints)."""
    named = [case for case in ALL_CASES if case.nesting is not None]
    assert named and [case.id for case in named if not ID_PATTERN.match(case.id)] == []
    spec = re.compile(r"^[a-z0-9_.()+&@:-]+$")
    assert [case.id for case in ALL_CASES if not spec.match(case.id)] == []


def test_every_case_id_round_trips():
    bad = [case.id for case in ALL_CASES if parse_case_id(case.id) != case]
    assert bad == []


def test_case_ids_are_unique():
    ids = [case.id for case in ALL_CASES]
    assert len(set(ids)) == len(ids)


def test_case_id_joins_values_in_axis_order():
    case = Case(Mode.NONREENTRANT, Layout.TRACKED, Capture.SEPARATE, parse_program("nested"),
                Interleave.DRAWS, Device.CUDA)
    assert case.id == "nonreentrant-tracked-separate-nested-draws-cuda"
    assert str(case) == case.id
    assert list(case.axis_values()) == [*AXES, "program"]
    other = Case(Mode.REENTRANT, Layout.MIXED, Capture.SINGLE, parse_program("rand.bf16.odd.keyword.deep"),
                 Interleave.NONE, Device.CUDA)
    assert other.id == "reentrant-mixed-single-rand.bf16.odd.keyword.deep-none-cuda"
    assert other.axis_values()["op"] == "rand" and other.nesting is Nesting.DEEP


def test_parse_case_id_ignores_surrounding_whitespace():
    assert parse_case_id("  reentrant-mixed-eager-flat-none-cpu\n").id == (
        "reentrant-mixed-eager-flat-none-cpu"
    )


# --- filters ------------------------------------------------------------------------------------


def _layouts(**filters: object) -> set[Layout]:
    return {case.layout for case in generate(**filters)}


def test_filter_accepts_enum_member():
    assert _layouts(layout=Layout.TRACKED) == {Layout.TRACKED}


def test_filter_accepts_value_string():
    assert _layouts(layout="tracked") == {Layout.TRACKED}


def test_filter_accepts_comma_string():
    assert _layouts(layout="tracked,mixed") == {Layout.TRACKED, Layout.MIXED}


def test_filter_comma_string_tolerates_spaces_and_case():
    assert _layouts(layout=" Tracked , MIXED ") == {Layout.TRACKED, Layout.MIXED}


def test_filter_accepts_list_of_strings_and_members():
    assert _layouts(layout=["tracked", Layout.SHARED]) == {Layout.TRACKED, Layout.SHARED}


def test_filtered_count_is_the_product_of_the_restricted_axes():
    cases = list(generate(device="cpu", mode="reentrant", layout="tracked,mixed", program=CLASSIC))
    # 2 layouts x 1 capture (eager) x 3 programs x 2 interleaves
    assert len(cases) == 12
    assert all(c.mode is Mode.REENTRANT and c.device is Device.CPU for c in cases)


def test_filters_combine_with_the_rule_table():
    # single capture exists only on cuda, so asking for it on cpu gives nothing
    assert list(generate(device="cpu", capture="single")) == []



# --- errors -------------------------------------------------------------------------------------


def test_unknown_axis_value_names_valid_values():
    with pytest.raises(CaseError) as excinfo:
        list(generate(layout="bogus"))
    message = str(excinfo.value)
    assert "bogus" in message
    for value in _values("layout"):
        assert value in message


def test_axis_value_of_another_axis_is_rejected():
    with pytest.raises(CaseError, match="valid values"):
        list(generate(layout=Mode.REENTRANT))


def test_unknown_axis_names_the_axes():
    with pytest.raises(CaseError) as excinfo:
        list(generate(colour="red"))
    message = str(excinfo.value)
    assert "colour" in message
    for axis in AXES:
        assert axis in message


def test_empty_filter_is_rejected_with_valid_values():
    with pytest.raises(CaseError) as excinfo:
        list(generate(nesting=" , "))
    for value in _values("nesting"):
        assert value in str(excinfo.value)


def test_parse_value_rejects_unknown_axis():
    with pytest.raises(CaseError, match="unknown axis 'colour'"):
        parse_value("colour", "red")


@pytest.mark.parametrize("bad_id", ["reentrant-tracked", "", "a-b-c-d-e-f-g"])
def test_bad_id_with_wrong_part_count_names_the_expected_parts(bad_id):
    with pytest.raises(CaseError) as excinfo:
        parse_case_id(bad_id)
    assert "mode-layout-capture-program-interleave-device" in str(excinfo.value)


def test_bad_id_with_unknown_value_names_valid_values():
    with pytest.raises(CaseError) as excinfo:
        parse_case_id("reentrant-bogus-eager-flat-none-cpu")
    for value in _values("layout"):
        assert value in str(excinfo.value)


def test_invalid_combination_is_refused_with_its_reason():
    with pytest.raises(CaseError) as excinfo:
        parse_case_id("reentrant-default-single-flat-none-cpu")
    message = str(excinfo.value)
    assert "reentrant-default-single-flat-none-cpu" in message
    assert "cuda" in message


def test_case_error_is_a_value_error():
    assert issubclass(CaseError, ValueError)


# --- order --------------------------------------------------------------------------------------


def test_generate_order_is_stable_between_calls():
    assert [c.id for c in generate()] == [c.id for c in ALL_CASES]


def test_generate_order_is_device_then_program_then_the_axes():
    assert ALL_CASES[0].id == "reentrant-default-eager-flat-none-cpu"
    classic_cuda = list(generate(device="cuda", program=CLASSIC))
    assert classic_cuda[-1].id == "nonreentrant-untracked-single-siblings-draws-cuda"
    cuda_corpus = corpus.cases("cuda")  # the corpus comes last, after the pinned cells
    assert ALL_CASES[-1] == cuda_corpus[-1] if cuda_corpus else ALL_CASES[-1].id == f"{PINNED[-1]}-cuda"


def test_filtered_generation_keeps_the_full_order():
    subset = [c for c in ALL_CASES if c.layout in (Layout.TRACKED, Layout.SHARED)]
    assert list(generate(layout="tracked,shared")) == subset
