"""Results on disk as they are judged: one JSON line per case, appended and flushed at once.

A CI job stopped at its time limit (SIGTERM), a second Ctrl-C or a killed process must not lose
the cases that finished.  `LiveResults` starts ``DIR/results.jsonl`` at the run's first record and
appends every record the moment it is judged (written to the operating system, so it survives the
process); the final report rewrites the file sorted, beside the other views.  After a kill,
``python -m harness report DIR`` rebuilds summary.md, report.html and the CSVs from what is there.

Nothing a user has is lost on the way: a folder that already holds a report is refused before the
run (`reporting.check_report_dir`) unless the run replaces it on purpose, and then the old report's
files are removed at the first record, never left beside the new results (a run stopped before
its first record leaves the old report whole).  A write that fails (a full disk) cuts the file
back to its last whole record and raises `ReportWriteError` naming the file: the caller stops the
run and writes the report of what was judged where it can (`reporting.write_or_fallback`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..results import CaseRecord, as_json
from . import ReportWriteError, clear_report


class LiveResults:
    """``DIR/results.jsonl`` for this run, opened at the first `append`, which writes one record
    and hands it to the operating system.  `replace`: the run replaces a report the folder holds
    (removed at the first record)."""

    def __init__(self, report_dir: "str | Path", *, replace: bool = False) -> None:
        self.path = Path(report_dir) / "results.jsonl"
        self.replace = replace
        self._fd: int | None = None
        self._size = 0  # bytes of whole records written: where a failed write is cut back to
        self._closed = False
        self.count = 0

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.replace:
                clear_report(self.path.parent)
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except ReportWriteError:
            raise
        except OSError as exc:
            raise ReportWriteError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def append(self, record: "CaseRecord | dict[str, Any]") -> None:
        """Write `record` as one line (the report keeps it if the run is killed).  A write that
        fails leaves the file at its last whole record and raises ReportWriteError."""
        if self._closed:
            return
        if self._fd is None:
            self._fd = self._open()
        data = (json.dumps(as_json([record])[0], sort_keys=True) + "\n").encode("utf-8")
        written = 0
        try:
            while written < len(data):  # a full disk may take part of a line before it refuses
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)  # no partial line: `report DIR` reads every line
            except OSError:
                pass
            self.close()
            raise ReportWriteError(f"cannot write {self.path}: {exc.strerror or exc} (it keeps the {self.count} "
                                   f"record{'s' * (self.count != 1)} written before)") from None
        self._size += written
        self.count += 1

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass  # every byte went through os.write already: nothing buffered is lost

    def __enter__(self) -> "LiveResults":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
