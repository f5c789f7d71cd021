"""Expectation files shared by the command-line and pytest-plugin tests of verdicts: an entry that
expects the default failure (a mismatch) of an adapter that raises, one that expects its error, and
one that says `bundled` fails a case it passes (stale)."""

from __future__ import annotations

from pathlib import Path

RAISE = "faulty_adapters:make_raise"
EXPECT_MISMATCH = f'[[expect]]\nimpl = "{RAISE}"\ncases = ["*"]\nreason = "expects the default outcome"\n'
EXPECT_ERROR = (f'[[expect]]\nimpl = "{RAISE}"\ncases = ["*"]\noutcome = "error"\nmessage = "raised on purpose"\n'
                'reason = "raises on purpose"\n')
EXPECT_STALE = ('[[expect]]\nimpl = "bundled"\ncases = ["reentrant-default-eager-flat-none-cpu"]\n'
                'reason = "bundled passes this: the entry is stale"\n')


def expectations_file(tmp_path: Path, text: str) -> Path:
    """`text` written as tmp_path/expectations.toml; its path."""
    path = tmp_path / "expectations.toml"
    path.write_text(text)
    return path
