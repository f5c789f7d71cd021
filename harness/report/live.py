"""Results on disk as they are judged: one JSON line per case, appended and flushed at once.

A CI job stopped at its time limit (SIGTERM), a second Ctrl-C or a killed process must not lose
the cases that finished.  `LiveResults` truncates ``DIR/results.jsonl`` when a run starts and
appends every record the moment it is judged (flushed to the operating system, so it survives the
process); the final report rewrites the file sorted, beside the other views.  After a kill,
``python -m harness report DIR`` rebuilds summary.md, report.html and the CSVs from what is there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from ..results import CaseRecord, as_json
from . import ReportError


class LiveResults:
    """``DIR/results.jsonl`` opened for this run: `append` writes one record and flushes."""

    def __init__(self, report_dir: "str | Path") -> None:
        self.path = Path(report_dir) / "results.jsonl"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")
        except OSError as exc:
            raise ReportError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.count = 0

    def append(self, record: "CaseRecord | dict[str, Any]") -> None:
        """Write `record` as one line and flush it (the report keeps it if the run is killed)."""
        if self._file is None:
            return
        self._file.write(json.dumps(as_json([record])[0], sort_keys=True) + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "LiveResults":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
