"""Shared by the harness's own tests."""

import pytest

from harness.run.references import REFERENCES


@pytest.fixture(autouse=True)
def _fresh_references():
    """Each test makes its own reference runs: a test that breaks the workload or a tracker (a
    monkeypatch) must not meet a reference another test made, nor leave one behind."""
    REFERENCES.clear()
    yield
    REFERENCES.clear()
