"""Version-aware expectations: an entry's `versions` range decides which impl versions it covers."""

from __future__ import annotations

import pytest

from harness.verdict import expectations
from harness.verdict.expectations import Expectation, ExpectationError, find, version_in

CASE = "reentrant-tracked-eager-flat-none-cuda"


def _write(tmp_path, body: str):
    path = tmp_path / "e.toml"
    path.write_text(body)
    return expectations.load(path)


RANGED = """
[[expect]]
impl = "megatron-graphsafe"
cases = ["*-tracked-*"]
versions = ">=0.16,<0.20"
reason = "checkpoint saves live generator handles"
issue = "NVIDIA/Megatron-LM#5841"

[[expect]]
impl = "torch"
cases = ["*-tracked-*"]
reason = "never saves tracker streams"
"""


def test_versions_key_is_loaded_and_optional(tmp_path):
    ranged, plain = _write(tmp_path, RANGED)
    assert ranged.versions == ">=0.16,<0.20" and ranged.issue == "NVIDIA/Megatron-LM#5841"
    assert plain.versions == ""
    assert "versions >=0.16,<0.20" in ranged.describe()
    assert plain.describe() == "torch: *-tracked-*"


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.16.0", True),
        ("0.19.2", True),
        ("0.19.3.dev0+g2f2f8eb", True),  # a dev build of a release in range
        ("0.20.0", False),  # the fixed release: the xfail no longer applies, a pass is a pass
        ("0.20.0rc1", False),  # a pre-release of 0.20 is not "<0.20" (PEP 440)
        ("0.15.9", False),
        (None, False),  # a ranged entry never matches an unknown version
        ("", False),
        ("not a version", False),
    ],
)
def test_a_ranged_entry_matches_only_versions_in_range(tmp_path, version, expected):
    entries = _write(tmp_path, RANGED)
    entry = find(entries, "megatron-graphsafe", CASE, version)
    assert (entry is not None) is expected


@pytest.mark.parametrize("version", [None, "2.13.0+cpu", "0.1", "nonsense"])
def test_an_entry_without_versions_matches_any_version(tmp_path, version):
    entries = _write(tmp_path, RANGED)
    assert find(entries, "torch", CASE, version) is entries[1]


def test_existing_callers_without_a_version_keep_working(tmp_path):
    entries = _write(tmp_path, RANGED)
    assert find(entries, "torch", CASE) is entries[1]  # no version argument at all
    assert find(entries, "megatron-graphsafe", CASE) is None  # ranged: version unknown
    assert find(entries, "torch", "reentrant-default-eager-flat-none-cuda") is None


def test_first_matching_entry_in_range_wins(tmp_path):
    entries = _write(tmp_path, """
[[expect]]
impl = "te"
cases = ["*"]
versions = "<2.0"
reason = "old"

[[expect]]
impl = "te"
cases = ["*"]
versions = ">=2.0"
reason = "new"

[[expect]]
impl = "te"
cases = ["*"]
reason = "any"
""")
    assert find(entries, "te", CASE, "1.13.0").reason == "old"
    assert find(entries, "te", CASE, "2.9.0").reason == "new"
    assert find(entries, "te", CASE, None).reason == "any"


def test_unmatched_ignores_versions(tmp_path):
    """A ranged entry whose patterns match a case is not dead, whatever version runs today."""
    entries = _write(tmp_path, RANGED)
    assert expectations.unmatched(entries, [CASE]) == []
    assert expectations.unmatched(entries, ["reentrant-default-eager-flat-none-cuda"]) == entries


@pytest.mark.parametrize(
    "line, message",
    [
        ('versions = ">=0.16;<0.20"', "bad versions specifier '>=0.16;<0.20'"),
        ('versions = "0.19"', "bad versions specifier '0.19'"),
        ('versions = [">=0.16"]', "versions must be a string"),
        ("versions = 16", "versions must be a string"),
    ],
)
def test_bad_versions_are_one_line_errors(tmp_path, line, message):
    with pytest.raises(ExpectationError, match="entry 1") as excinfo:
        _write(tmp_path, f'[[expect]]\nimpl = "x"\ncases = ["*"]\nreason = "r"\n{line}\n')
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_expectation_defaults_keep_the_old_constructor():
    entry = Expectation("torch", ("*",), "reason")
    assert entry.versions == "" and entry.applies_to(None) and entry.applies_to("1.0")
    ranged = Expectation("torch", ("*",), "reason", "", ">=2.13")
    assert ranged.applies_to("2.13.0+cu130") and not ranged.applies_to("2.11.0") and not ranged.applies_to(None)


def test_version_in_helper():
    assert version_in("0.19.2", ">=0.16,<0.20")
    assert version_in("0.19.2", "")  # an empty range is every version, once the version is known
    assert not version_in(None, "")


def test_shipped_file_still_loads():
    for entry in expectations.load():
        assert isinstance(entry.versions, str)


TORCH_RANGED = """
[[expect]]
impl = "neg-host-values"
cases = ["*-separate-*-none-cuda"]
torch = ">=2.14"
reason = "per-capture Philox state: a host rewind misses the forward even without a replay between"
"""


@pytest.mark.parametrize("torch_version, expected", [("2.14.1+cu130", True), ("2.15.0", True),
                                                     ("2.11.0+cu130", False), ("2.13.0+cpu", False)])
def test_a_torch_range_selects_by_the_torch_under_test(tmp_path, monkeypatch, torch_version, expected):
    import torch

    (entry,) = _write(tmp_path, TORCH_RANGED)
    assert entry.torch == ">=2.14" and entry.versions == ""
    assert "torch >=2.14" in entry.describe()
    case = "reentrant-default-separate-flat-none-cuda"
    assert entry.applies_to("0.1.0", torch_version) is expected  # the impl's own version is not torch's
    monkeypatch.setattr(torch, "__version__", torch_version)  # the default: this process's torch
    assert (find([entry], "neg-host-values", case, "0.1.0") is entry) is expected
    explained = expectations.explain([entry], "neg-host-values", case, "0.1.0")
    assert ("MATCH" in explained[0]) is expected
    assert expected or f"torch {torch_version} is outside >=2.14" in explained[0]


def test_a_bad_torch_range_is_a_one_line_error(tmp_path):
    with pytest.raises(ExpectationError, match=r"entry 1: bad versions specifier '2\.14'"):
        _write(tmp_path, '[[expect]]\nimpl = "x"\ncases = ["*"]\nreason = "r"\ntorch = "2.14"\n')
    with pytest.raises(ExpectationError, match="torch must be a string"):
        _write(tmp_path, '[[expect]]\nimpl = "x"\ncases = ["*"]\nreason = "r"\ntorch = 2.14\n')
