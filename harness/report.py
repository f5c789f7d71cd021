"""Results -> report directory: results.jsonl (the stable source) and summary.md.

The report never re-runs anything: it reads result records (the dicts of `CaseResult.to_dict`,
annotated by `annotate`) and renders them with pandas and tabulate (`DataFrame.to_markdown`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from .cases import Capture, Layout
from .expectations import Expectation
from .compare import Mismatch

VERDICTS = ("pass", "fail", "xfail", "stale", "skip")
MAX_MISMATCH_LINES = 12  # per failing case in summary.md; the jsonl keeps all of them


class ReportError(OSError):
    """The report directory is unusable; the message is one line for the user."""


def verdict(outcome: str, expected: bool) -> str:
    """How a result counts: fail / xfail for a mismatch or error, stale for an expected failure
    that passed, skip for unsupported or skipped cases."""
    if outcome in ("unsupported", "skipped"):
        return "skip"
    failed = outcome in ("mismatch", "error")
    if expected:
        return "xfail" if failed else "stale"
    return "fail" if failed else "pass"


def annotate(record: dict[str, Any], expectation: Expectation | None) -> dict[str, Any]:
    """Add the expectation (reason, issue) and the verdict to a result record, in place."""
    record["expected_failure"] = expectation.reason if expectation else ""
    record["expected_issue"] = expectation.issue if expectation else ""
    record["verdict"] = verdict(record["outcome"], expectation is not None)
    return record


def environment() -> dict[str, Any]:
    """What ran the cases: versions, GPU, and which RNG APIs this torch build has."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "gpu": "none",
    }
    gen = torch.default_generator
    apis = {
        "Generator.graphsafe_get_state": hasattr(gen, "graphsafe_get_state"),
        "Generator.philox_state": hasattr(gen, "philox_state"),
        "CUDAGraph.register_generator_state": hasattr(torch.cuda.CUDAGraph, "register_generator_state")
        if hasattr(torch.cuda, "CUDAGraph") else False,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = f"{props.name} (sm_{props.major}{props.minor}) x{torch.cuda.device_count()}"
        driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        if driver is not None:
            version = driver()
            env["driver (CUDA API)"] = f"{version // 1000}.{version % 1000 // 10}"
        cuda_gen = torch.cuda.default_generators[0]
        apis["Generator.philox_state"] = hasattr(cuda_gen, "philox_state")
    env["rng_apis"] = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in apis.items())
    return env


def repro_command(record: dict[str, Any]) -> str:
    """A copy-paste command that reruns one case alone."""
    return f"python -m harness repro {record['case_id']} --impl {record['impl']}"


def _md_escape(value: Any) -> Any:
    return value.replace("|", "\\|") if isinstance(value, str) else value


def _table(frame: Any) -> str:
    frame = frame.map(_md_escape) if hasattr(frame, "map") else frame.applymap(_md_escape)
    return frame.to_markdown()


def results_frame(records: list[dict[str, Any]]) -> Any:
    """One row per case with the axis columns, outcome, verdict and mismatch count."""
    import pandas as pd

    frame = pd.DataFrame(records)
    frame["mismatch_count"] = frame["mismatches"].map(len)
    return frame


def _cell(group: Any) -> str:
    counts = group["verdict"].value_counts()
    total = len(group)
    parts = [f"{verdict} {counts[verdict]}" for verdict in VERDICTS if verdict in counts]
    return f"{' · '.join(parts)} /{total}"


def matrix_markdown(frame: Any, impl: str, mode: str) -> str:
    """Layout x capture for one impl and mode; nesting and interleave folded in as counts."""
    import pandas as pd

    part = frame[(frame["impl"] == impl) & (frame["mode"] == mode)]
    if part.empty:
        return ""
    cells = {key: _cell(group) for key, group in part.groupby(["layout", "capture"])}
    table = pd.Series(cells).unstack(fill_value="")
    rows = [v.value for v in Layout if v.value in table.index]
    cols = [v.value for v in Capture if v.value in table.columns]
    table = table.reindex(index=rows, columns=cols)
    table.index.name, table.columns.name = "layout", None
    return _table(table)


def summary_markdown(records: list[dict[str, Any]], env: dict[str, Any]) -> str:
    """The markdown summary: environment, counts per impl, matrices, then every failing case."""
    frame = results_frame(records)
    lines = ["# Checkpoint RNG harness report", ""]
    lines += [f"- **{key}**: {value}" for key, value in env.items()]
    lines += ["", "## Outcomes per implementation", ""]
    outcomes = frame.pivot_table(index="impl", columns="outcome", aggfunc="size", fill_value=0)
    lines += [_table(outcomes), ""]
    verdicts = frame.pivot_table(index="impl", columns="verdict", aggfunc="size", fill_value=0)
    lines += ["Verdicts (xfail: a known failure from cases/expectations.toml; stale: an expected "
              "failure that passed):", "", _table(verdicts), ""]
    lines += ["## Layout x capture", ""]
    for impl in sorted(frame["impl"].unique()):
        for mode in sorted(frame["mode"].unique()):
            table = matrix_markdown(frame, impl, mode)
            if table:
                lines += [f"### {impl} · {mode}", "", table, ""]
    failing = [r for r in records if r["verdict"] in ("fail", "xfail", "stale")]
    lines += ["## Failing and stale cases", ""]
    if not failing:
        lines += ["None.", ""]
    for record in sorted(failing, key=lambda r: (r["verdict"] != "fail", r["impl"], r["case_id"])):
        lines += _case_section(record)
    return "\n".join(lines)


def _case_section(record: dict[str, Any]) -> list[str]:
    title = f"### {record['impl']} · `{record['case_id']}` · {record['verdict']} ({record['outcome']})"
    lines = [title, ""]
    if record.get("expected_failure"):
        lines += [f"Expected: {record['expected_failure']}", ""]
    if record["outcome"] == "error":
        lines += ["```", record["error"], "```", ""]
    mismatches = [Mismatch(**{**m, "first_index": _index(m["first_index"])}) for m in record["mismatches"]]
    if mismatches:
        lines += ["```"] + [m.message() for m in mismatches[:MAX_MISMATCH_LINES]]
        if len(mismatches) > MAX_MISMATCH_LINES:
            lines.append(f"... {len(mismatches) - MAX_MISMATCH_LINES} more in results.jsonl")
        lines += ["```", ""]
    lines += ["Rerun alone:", "", "```sh", repro_command(record), "```", ""]
    return lines


def _index(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_report_dir(root: "str | Path" = "reports") -> Path:
    """reports/<timestamp>-<pid>: a new directory per run."""
    return Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def write(records: Iterable[dict[str, Any]], report_dir: "str | Path", env: dict[str, Any] | None = None) -> Path:
    """Write results.jsonl and summary.md into `report_dir` (created); return the directory.

    Each file is written atomically, and `reports/latest` (a symlink beside the run directory)
    points at the newest run.
    """
    records = sorted(records, key=lambda r: (r["impl"], r["case_id"]))
    report_dir = Path(report_dir)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create report directory {report_dir}: {exc.strerror or exc}") from None
    if not os.access(report_dir, os.W_OK):
        raise ReportError(f"report directory {report_dir} is not writable")
    env = env or environment()
    jsonl = "".join(json.dumps({**r, "env": env}, sort_keys=True) + "\n" for r in records)
    _atomic_write(report_dir / "results.jsonl", jsonl)
    if records:
        _atomic_write(report_dir / "summary.md", summary_markdown(records, env))
    _point_latest(report_dir)
    return report_dir


def _point_latest(report_dir: Path) -> None:
    latest = report_dir.parent / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            tmp = report_dir.parent / f".latest.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(report_dir.name)
            os.replace(tmp, latest)
    except OSError:
        pass  # the pointer is a convenience; the run directory itself is complete
