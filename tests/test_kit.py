"""tools/torch214_kit.sh: the GPU machine's second torch (issue 27).  What runs without the package
index and without a GPU: the script parses, bad input is one line and exit 2, and the join checks
every wheel against the manifest (a missing or changed part is refused)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parent.parent / "tools" / "torch214_kit.sh"


def kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(KIT), *args], capture_output=True, text=True, timeout=120)


def test_the_kit_parses_and_refuses_bad_input_in_one_line(tmp_path):
    assert subprocess.run(["bash", "-n", str(KIT)]).returncode == 0
    for args, message in ((["nonsense"], "usage:"), (["calls", str(tmp_path)], "run 'prepare' first"),
                          (["gather", str(tmp_path / "p99")], "name it in the call's carry"),
                          (["install", str(tmp_path)], "MANIFEST missing")):
        done = kit(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


@pytest.fixture
def stage(tmp_path):
    """A stage as `gather` leaves it: a small 'wheel' in two parts and its manifest line."""
    data = bytes(range(256)) * 1000
    name = "demo-1.0-py3-none-any.whl"
    (tmp_path / f"{name}.part00").write_bytes(data[:100_000])
    (tmp_path / f"{name}.part01").write_bytes(data[100_000:])
    (tmp_path / "MANIFEST").write_text(f"{name} {len(data)} {hashlib.sha256(data).hexdigest()} 2\n")
    return tmp_path, name


def test_install_refuses_a_missing_part(stage):
    path, name = stage
    (path / f"{name}.part01").unlink()
    done = kit("install", str(path), str(path / "site"))
    assert done.returncode == 2 and "1 of 2 parts" in done.stderr


def test_install_refuses_a_changed_part(stage):
    path, name = stage
    part = path / f"{name}.part01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    done = kit("install", str(path), str(path / "site"))
    assert done.returncode == 2 and "sha256 differs" in done.stderr
