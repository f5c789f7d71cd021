"""The expectations file agrees with the meta-tests, and its loader handles bad input."""

from __future__ import annotations

import pytest

from harness import expectations
from harness.cases import generate

from test_negative_controls import EXPECTED_MISMATCH

CPU_CASES = tuple(generate(device="cpu"))


@pytest.mark.parametrize("impl", sorted(EXPECTED_MISMATCH))
def test_file_marks_exactly_the_cpu_cells_the_meta_tests_expect_to_fail(impl):
    entries = expectations.load()
    for case in CPU_CASES:
        marked = expectations.find(entries, impl, case.id) is not None
        assert marked == EXPECTED_MISMATCH[impl](case), f"{impl} {case.id}"


def test_every_entry_matches_some_case():
    ids = [case.id for case in generate()]
    assert expectations.unmatched(expectations.load(), ids) == []


def test_an_entry_that_matches_nothing_is_reported(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torch"\ncases = ["*-nosuchlayout-*"]\nreason = "r"\n')
    entries = expectations.load(path)
    assert expectations.unmatched(entries, [c.id for c in generate()]) == entries


def test_missing_keys_and_bad_toml_are_one_line_errors(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torch"\n')
    with pytest.raises(expectations.ExpectationError, match="lacks cases, reason"):
        expectations.load(path)
    path.write_text("[[expect]\n")
    with pytest.raises(expectations.ExpectationError, match="cannot read"):
        expectations.load(path)
    with pytest.raises(expectations.ExpectationError, match="does not exist"):
        expectations.load(tmp_path / "missing.toml")
