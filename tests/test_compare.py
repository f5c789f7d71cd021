"""Bitwise comparison: signed zeros, NaN payloads, integer views and the Mismatch record."""

from __future__ import annotations

import pytest
import torch

from harness.check.compare import Mismatch, bitwise_diff, int_view

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.bool: torch.uint8,
}
# Two quiet NaNs per dtype that differ only in the lowest payload bit.
NAN_BITS = {
    torch.float64: (torch.int64, 0x7FF8000000000000, 0x7FF8000000000001),
    torch.float32: (torch.int32, 0x7FC00000, 0x7FC00001),
    torch.float16: (torch.int16, 0x7E00, 0x7E01),
    torch.bfloat16: (torch.int16, 0x7FC0, 0x7FC1),
}


def diff(got, expected):
    return bitwise_diff(got, expected, oracle="gradient", subject="input", iteration=0)


def nan_with_bits(dtype, bits):
    int_dtype = NAN_BITS[dtype][0]
    return torch.tensor([bits], dtype=int_dtype).view(dtype)


# --- what counts as equal -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_positive_and_negative_zero_are_a_mismatch(dtype):
    result = diff(torch.tensor([0.0], dtype=dtype), torch.tensor([-0.0], dtype=dtype))
    assert result is not None
    assert (result.count, result.total) == (1, 1)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_nans_with_different_payloads_are_a_mismatch(dtype):
    _, first, second = NAN_BITS[dtype]
    a, b = nan_with_bits(dtype, first), nan_with_bits(dtype, second)
    assert a.isnan().all() and b.isnan().all()
    assert diff(a, b) is not None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_identical_nan_bit_patterns_are_equal(dtype):
    _, bits, _ = NAN_BITS[dtype]
    assert diff(nan_with_bits(dtype, bits), nan_with_bits(dtype, bits)) is None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_identical_values_are_equal(dtype):
    t = torch.linspace(-3, 3, 17).to(dtype)
    assert diff(t, t.clone()) is None


def test_noncontiguous_tensors_compare_by_value():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert diff(t.t(), t.t().contiguous()) is None


# --- integer views ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(SAME_WIDTH_INT), ids=str)
def test_int_view_maps_to_the_same_width_int_dtype(dtype):
    view = int_view(torch.zeros(3, dtype=dtype))
    assert view.dtype == SAME_WIDTH_INT[dtype]
    assert view.element_size() == torch.zeros(1, dtype=dtype).element_size()
    assert view.shape == (3,)


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
)
def test_int_view_of_float8_is_uint8(name):
    if not hasattr(torch, name):
        pytest.skip(f"torch has no {name}")
    assert int_view(torch.zeros(2, dtype=getattr(torch, name))).dtype == torch.uint8


def test_int_view_shows_the_sign_bit_of_negative_zero():
    assert int_view(torch.tensor([-0.0])).item() == -(2**31)


def test_int_view_of_an_integer_tensor_is_unchanged():
    t = torch.arange(5, dtype=torch.int64)
    assert int_view(t).dtype == torch.int64
    assert torch.equal(int_view(t), t)


def test_int_view_of_a_noncontiguous_tensor_is_contiguous():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    assert int_view(t).is_contiguous()


def test_int_view_of_complex_views_real_and_imaginary_parts():
    view = int_view(torch.zeros(4, dtype=torch.complex64))
    assert view.dtype == torch.int32
    assert view.shape == (4, 2)


# --- bool masks ---------------------------------------------------------------------------------


def test_equal_bool_masks_are_equal():
    mask = torch.tensor([True, False, True, True])
    assert diff(mask, mask.clone()) is None


def test_bool_mask_difference_is_reported_with_bool_values():
    expected = torch.tensor([True, False, True, True])
    got = expected.clone()
    got[2] = False
    result = diff(got, expected)
    assert result is not None
    assert (result.count, result.total, result.first_index) == (1, 4, 2)
    assert (result.got, result.expected) == ("False", "True")


# --- dtype and shape ----------------------------------------------------------------------------


def test_dtype_difference_is_a_mismatch_of_every_element():
    result = diff(torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float32))
    assert result is not None
    assert (result.count, result.total) == (4, 4)
    assert "torch.float64" in result.detail and "torch.float32" in result.detail


def test_shape_difference_is_a_mismatch():
    result = diff(torch.zeros(2, 2), torch.zeros(4))
    assert result is not None
    assert result.first_index is None
    assert "(2, 2)" in result.detail and "(4,)" in result.detail


# --- the Mismatch record ------------------------------------------------------------------------


@pytest.fixture
def two_d_mismatch() -> Mismatch:
    expected = torch.zeros(3, 4)
    got = expected.clone()
    got[1, 2] = -0.0
    got[2, 3] = 1.0
    result = diff(got, expected)
    assert result is not None
    return result


def test_mismatch_counts_differing_elements(two_d_mismatch):
    assert (two_d_mismatch.count, two_d_mismatch.total) == (2, 12)


def test_mismatch_first_index_is_a_tuple_for_2d(two_d_mismatch):
    assert two_d_mismatch.first_index == (1, 2)


def test_mismatch_values_show_bit_patterns(two_d_mismatch):
    assert two_d_mismatch.got == "-0.0 (0x80000000)"
    assert two_d_mismatch.expected == "0.0 (0x00000000)"


def test_mismatch_message_has_pytorch_shape(two_d_mismatch):
    assert two_d_mismatch.message() == (
        "gradient input iteration 0: Mismatched elements: 2 / 12 (16.7%), "
        "first at index (1, 2): got -0.0 (0x80000000), expected 0.0 (0x00000000)"
    )


def test_mismatch_first_index_is_an_int_for_1d():
    expected = torch.arange(8, dtype=torch.float32)
    got = expected.clone()
    got[5] = 7.5
    result = diff(got, expected)
    assert result is not None
    assert result.first_index == 5
    assert result.message().endswith(
        "Mismatched elements: 1 / 8 (12.5%), first at index 5: "
        "got 7.5 (0x40f00000), expected 5.0 (0x40a00000)"
    )


def test_half_precision_bit_pattern_uses_four_hex_digits():
    half = torch.float16
    result = diff(torch.tensor([-0.0], dtype=half), torch.tensor([0.0], dtype=half))
    assert result is not None
    assert result.got == "-0.0 (0x8000)"
    assert result.expected == "0.0 (0x0000)"


def test_nan_payload_is_visible_in_the_values():
    got, expected = (nan_with_bits(torch.float32, bits) for bits in (0x7FC00001, 0x7FC00000))
    result = diff(got, expected)
    assert result is not None
    assert result.got == "nan (0x7fc00001)"
    assert result.expected == "nan (0x7fc00000)"


def test_mismatch_records_oracle_subject_and_iteration():
    result = bitwise_diff(
        torch.ones(2), torch.zeros(2), oracle="recompute-mask", subject="s3", iteration=4
    )
    assert result is not None
    assert (result.oracle, result.subject, result.iteration) == ("recompute-mask", "s3", 4)
    assert result.message().startswith("recompute-mask s3 iteration 4: Mismatched elements: 2 / 2")


def test_message_with_only_a_detail():
    m = Mismatch("recompute-mask", "s1", 0, 0, 0, detail="the site was never recomputed")
    assert m.message() == "recompute-mask s1 iteration 0: the site was never recomputed"


def test_to_dict_turns_a_tuple_index_into_a_list(two_d_mismatch):
    data = two_d_mismatch.to_dict()
    assert data["first_index"] == [1, 2]
    assert data["count"] == 2 and data["oracle"] == "gradient"


@pytest.mark.parametrize("end_to_end", [None, True, False])
def test_any_differences_flags_exactly_the_differing_pairs(end_to_end):
    # None: the device's own way (pair by pair on the CPU); True: laid end to end, as on a GPU.
    import torch as _t

    from harness.check.compare import any_differences

    a = _t.tensor([0.0, 1.0])
    pairs = [
        (a, a.clone()),                              # equal
        (a, _t.tensor([-0.0, 1.0])),                 # signed zero differs
        (a, a.double()),                             # dtype differs
        (a, _t.zeros(3)),                            # shape differs
        (_t.tensor([True, False]), _t.tensor([True, False])),
    ]
    assert any_differences(pairs, end_to_end) == [False, True, True, True, False]
    assert any_differences([], end_to_end) == []


@pytest.mark.parametrize("end_to_end", [True, False])
def test_any_differences_judges_each_pair_alone_whether_laid_end_to_end_or_not(end_to_end):
    # The pairs of one dtype are laid end to end and compared at once: a difference must be
    # counted for its own pair only, whether it sits at a pair's first or last element, next to
    # an empty pair, among dtypes that share an integer view (float32 and int32) or not.
    import torch as _t

    from harness.check.compare import any_differences

    base = _t.arange(6, dtype=_t.float32)
    last = base.clone()
    last[-1] = _t.nextafter(last[-1], _t.tensor(10.0))  # one ulp, at the end of its pair
    first = base.clone()
    first[0] = -0.0  # at the start of its pair, right after `last`
    nan_a = _t.tensor([float("nan")])
    nan_b = nan_a.view(_t.int32).add(1).view(_t.float32)  # another NaN payload
    pairs = [
        (base, base.clone()),
        (base, last),
        (base, first),
        (_t.empty(0), _t.empty(0)),
        (base.reshape(2, 3).t(), base.clone().reshape(2, 3).t()),  # not contiguous, equal
        (_t.arange(4, dtype=_t.int32), _t.arange(4, dtype=_t.int32)),
        (_t.arange(4, dtype=_t.int32), _t.tensor([0, 1, 2, 4], dtype=_t.int32)),
        (nan_a, nan_b),
        (_t.ones(3, dtype=_t.bfloat16), _t.ones(3, dtype=_t.bfloat16)),
        (_t.tensor([True]), _t.tensor([False])),
    ]
    expected = [False, True, True, False, False, False, True, True, False, True]
    assert any_differences(pairs, end_to_end) == expected
    for index, pair in enumerate(pairs):  # the same answers one pair at a time
        assert any_differences([pair], end_to_end) == [expected[index]]
