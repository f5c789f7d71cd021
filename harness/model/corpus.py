"""The corpus of fuzzer findings (`cases/corpus.toml`): cases the default matrix replays.

Each entry is a failure the fuzzer found and shrank: the case id (its program as a spec), the impl
it failed for, the outcome seen and the date.  The default matrix runs every entry's case for
every impl under test, like any other case, and judges it by the expectations file: a finding
that is a known bug of an impl needs an entry there too, and the day it is fixed the case shows
as stale.  The corpus is data that `python -m harness fuzz` appends to; edit it by hand freely.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .. import data as shipped_data
from .cases import Case, CaseError, parse_case_id

DEFAULT_PATH = shipped_data.path(shipped_data.CORPUS)
HEADER = """\
# Failures found by `python -m harness fuzz`, shrunk to their smallest program (harness/model/corpus.py).
# The default matrix replays every case here for every impl under test, judged by
# cases/expectations.toml like any other case.  The fuzzer appends; edit freely.
#   case     the case id: mode-layout-capture-PROGRAM-interleave-device (PROGRAM a spec)
#   impl     the impl it failed for when found
#   outcome  what was seen then: mismatch (oracles) or error (message)
#   found    the date
"""


class CorpusError(CaseError):
    """A corpus file that cannot be read; one line naming the file and the entry (bad input,
    like a bad case id)."""


@dataclass(frozen=True)
class Finding:
    """One corpus entry."""

    case: Case
    impl: str
    outcome: str
    found: str


def load(path: "str | Path | None" = None) -> list[Finding]:
    """The corpus entries of `path` (default `cases/corpus.toml`; a missing default file is an
    empty corpus).  A malformed entry raises `CorpusError`."""
    path = Path(path) if path else DEFAULT_PATH
    if not path.exists():
        if path == DEFAULT_PATH:
            return []
        raise CorpusError(f"corpus file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CorpusError(f"{path}: {exc}") from None
    findings = []
    for number, raw in enumerate(data.get("finding", []), 1):
        where = f"{path}: finding {number}"
        missing = [key for key in ("case", "impl", "outcome", "found") if not isinstance(raw.get(key), str)]
        if missing:
            raise CorpusError(f"{where}: missing or not a string: {', '.join(missing)}")
        try:
            case = parse_case_id(raw["case"])
        except CaseError as exc:
            raise CorpusError(f"{where}: {exc}") from None
        findings.append(Finding(case, raw["impl"], raw["outcome"], raw["found"]))
    return findings


def cases(device: str, path: "str | Path | None" = None) -> list[Case]:
    """The corpus cases on `device` (``cpu`` or ``cuda``), each once, in file order."""
    seen: dict[str, Case] = {}
    for finding in load(path):
        if finding.case.device.value == device:
            seen.setdefault(finding.case.id, finding.case)
    return list(seen.values())


def _quoted(text: str) -> str:
    """A TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def entry_text(case: Case, impl: str, outcome: str, found: "str | None" = None) -> str:
    """The TOML of one finding."""
    found = found or datetime.date.today().isoformat()
    return (f"\n[[finding]]\ncase = {_quoted(case.id)}\nimpl = {_quoted(impl)}\n"
            f"outcome = {_quoted(outcome)}\nfound = {_quoted(found)}\n")


def append(case: Case, impl: str, outcome: str, path: "str | Path | None" = None) -> bool:
    """Add a finding to the corpus (created with its header when missing); False, adding nothing,
    when the corpus already has this case for this impl."""
    path = Path(path) if path else DEFAULT_PATH
    if path.exists() and any(f.case.id == case.id and f.impl == impl for f in load(path)):
        return False
    text = path.read_text() if path.exists() else HEADER
    _replace(path, text + entry_text(case, impl, outcome))
    return True


def _replace(path: Path, text: str) -> None:
    """Write `text` as `path` through a temporary file beside it, moved into place when whole: a
    write that fails (a full disk) raises OSError and leaves the corpus as it was, never cut off."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a new corpus from others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
