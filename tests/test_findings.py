"""findings/: each write-up of a real bug pins default-matrix cells that its expectation claims.

A finding file starts with a TOML block between ``+++`` lines: ``name`` (the file's stem),
``reproducer`` (a script under findings/, run by hand where its device and package are), and
``pins``: per impl, the expectation entry naming the bug and the case ids where it shows.  The
cells must be cases of the default matrix (so every default run judges them) and the impl's first
matching entry must be the one that names the bug (so a fix turns them stale, loudly).
"""

from __future__ import annotations

import gzip
import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from machines import h200_torch_2_11

from harness.model.cases import parse_case_id
from harness.model.matrix import generate
from harness.verdict import expectations
from harness.verdict.audit import record_machine

FINDINGS = Path(__file__).resolve().parents[1] / "findings"
FILES = sorted(path for path in FINDINGS.glob("*.md") if path.name != "README.md")


def front_matter(path: Path) -> dict:
    """The TOML block between the first two ``+++`` lines of a finding file."""
    text = path.read_text()
    assert text.startswith("+++\n"), f"{path.name} must start with a +++ TOML block"
    return tomllib.loads(text.split("+++\n")[1])


@pytest.fixture(scope="module")
def default_ids() -> set[str]:
    return {case.id for case in generate()}


@pytest.fixture(scope="module")
def entries() -> list:
    return expectations.load()


@pytest.fixture(scope="module")
def cpu_records() -> dict:
    """(impl, case id) -> the committed record of the default CPU matrix: what its run observed
    (the backward graph's RNG ops a compiled impl's model asks) judges a pinned CPU cell."""
    path = FINDINGS.parent / "cases" / "records" / "cpu-torch2.13-default.jsonl.gz"
    with gzip.open(path, "rt") as source:
        return {(r["impl"], r["case_id"]): r for r in map(json.loads, source)}


def test_there_are_findings_and_the_index_lists_each():
    index = (FINDINGS / "README.md").read_text()
    assert len(FILES) >= 6
    for path in FILES:
        assert f"({path.name})" in index, f"findings/README.md does not link {path.name}"


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_a_finding_pins_default_cells_its_expectation_claims(path, default_ids, entries, cpu_records):
    meta = front_matter(path)
    assert meta["name"] == path.stem
    reproducer = FINDINGS / meta["reproducer"]
    assert reproducer.is_file(), f"{path.name}: no reproducer {meta['reproducer']}"
    py_compile.compile(str(reproducer), doraise=True)
    pins = meta.get("pins", [])
    assert pins or meta.get("no_pins"), f"{path.name}: pins no cell and says not why (no_pins)"
    for pin in pins:
        assert pin["cases"], f"{path.name}: a pin of {pin['impl']} names no case"
        for case_id in pin["cases"]:
            assert case_id in default_ids, f"{path.name}: {case_id} is not a case of the default matrix"
            # a CUDA cell is judged as on the H200 the finding was seen on (its attention backends),
            # a CPU cell with what its recorded run observed
            recorded = cpu_records.get((pin["impl"], case_id))
            machine = (h200_torch_2_11() if case_id.endswith("-cuda")
                       else record_machine(recorded) if recorded else None)
            entry = expectations.find(entries, pin["impl"], parse_case_id(case_id), pin.get("version"),
                                      machine=machine)
            assert entry is not None and entry.name == pin["expectation"], (
                f"{path.name}: {pin['impl']} {case_id} is claimed by {entry.label if entry else 'no entry'}, "
                f"not {pin['expectation']}")


def test_the_cpu_reproducer_of_the_sac_skew_runs():
    # It shows the bug on torch 2.13 (exit 1); a torch that fixes it exits 0.  Either way it must
    # run to its summary, not crash (exit 2 or a traceback).
    proc = subprocess.run([sys.executable, str(FINDINGS / "repro" / "sac_save_list_rng_skew.py"), "--cpu"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "input-gradient elements differ" in proc.stdout


def test_the_reproducer_of_the_regional_budget_runs():
    # It shows the bug on torch 2.13 (exit 1); a torch that fixes it exits 0, one without the
    # regional budget 2.  It must run to its summary, not crash: the control row is exact.
    proc = subprocess.run([sys.executable, str(FINDINGS / "repro" / "torch_region_budget_rng.py")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr
    if proc.returncode != 2:
        assert "b=1.0: forward equal; 0/65536 mask elements differ" in proc.stdout, proc.stdout + proc.stderr
