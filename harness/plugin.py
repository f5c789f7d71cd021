"""The pytest plugin: options, the case matrix, expectations as strict xfail, and the report.

Loaded by the repository's conftest.py.  Test functions that take the `harness_case` fixture are
parametrized over (impl x case); each runs `runner.run` and maps the outcome to pytest:
pass -> passed; mismatch and error -> failed with the mismatch lines; unsupported and skipped ->
skipped with the reason.  The result record rides on `item.user_properties`, which pytest-xdist
ships from workers to the controller, so the controller alone writes one report for the run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import expectations as expectations_mod
from . import gpus, impls, isolation, shards
from . import report as reporting
from .cases import CaseError, Case, generate
from .runner import ITERATIONS, Outcome, run

RESULT_PROPERTY = "harness_result"


@dataclass(frozen=True)
class HarnessCase:
    """One parameter of the matrix: an impl name and a case."""

    impl: str
    case: Case

    @property
    def id(self) -> str:
        return f"{self.impl}-{self.case.id}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "checkpoint RNG harness")
    group.addoption("--impl", action="append", default=[], metavar="NAME",
                    help="implementation(s) under test: a registered name or package.module:factory; "
                         "repeatable or comma-separated; 'all' = every shipped impl (default: bundled)")
    group.addoption("--device", default="auto", metavar="DEV",
                    help="auto (cuda if available, else cpu), cpu, cuda, or a comma list")
    group.addoption("--report-dir", default=None, metavar="DIR",
                    help="where the report goes (default: reports/<timestamp>-<pid>)")
    group.addoption("--expectations", default=None, metavar="FILE",
                    help="expected-failures file (default: cases/expectations.toml)")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run only shard I of N (deterministic split of impl x case, for CI jobs)")
    group.addoption("--isolate", action="store_true", default=False,
                    help="run each case in a replaceable worker process: an abort, segfault, hang or "
                         "sticky CUDA error becomes a crash/timeout result and the run goes on")
    group.addoption("--case-timeout", type=float, default=None, metavar="S",
                    help="per-case time limit in seconds (implies --isolate)")


def resolve_devices(value: str) -> list[str]:
    """Turn the --device option into device type names; 'auto' picks cuda when available."""
    import torch

    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    out: list[str] = []
    for name in names or ["auto"]:
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        if name not in ("cpu", "cuda"):
            raise CaseError(f"unknown device {name!r}; valid values: auto, cpu, cuda")
        if name not in out:
            out.append(name)
    return out


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: take a GPU of its own before any CUDA call
        config._harness_gpu = gpus.pin_worker(workerinput["workerid"], workerinput["testrunuid"])  # type: ignore[attr-defined]
    try:
        names = impls.parse_impl_names(config.getoption("impl"))
        config._harness_impls = {name: impls.load(name) for name in names}  # type: ignore[attr-defined]
        config._harness_devices = resolve_devices(config.getoption("device"))  # type: ignore[attr-defined]
        entries = expectations_mod.load(config.getoption("expectations"))
        shard = config.getoption("shard")
        config._harness_shard = shards.parse_shard(shard) if shard else None  # type: ignore[attr-defined]
        if workerinput is None and config.getoption("report_dir"):
            reporting.check_report_dir(config.getoption("report_dir"))
        timeout = config.getoption("case_timeout")
        if timeout is not None and timeout <= 0:
            raise CaseError(f"--case-timeout must be positive, got {timeout:g}")
    except (impls.ImplError, CaseError, expectations_mod.ExpectationError, shards.ShardError,
            reporting.ReportError) as exc:
        pytest.exit(f"error: {exc}", returncode=2)
    config._harness_expectations = entries  # type: ignore[attr-defined]
    config.pluginmanager.register(ReportCollector(config), "harness-report")
    all_ids = [case.id for case in generate()]
    for entry in expectations_mod.unmatched(entries, all_ids):
        config.issue_config_time_warning(
            pytest.PytestWarning(f"expectation matches no case: {entry.describe()}"), stacklevel=2
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    params = []
    for impl_name in config._harness_impls:  # type: ignore[attr-defined]
        for case in generate(device=config._harness_devices):  # type: ignore[attr-defined]
            if not shards.in_shard(impl_name, case.id, config._harness_shard):  # type: ignore[attr-defined]
                continue
            param = HarnessCase(impl_name, case)
            entry = expectations_mod.find(config._harness_expectations, impl_name, case.id,  # type: ignore[attr-defined]
                                          version=config._harness_impls[impl_name].version)  # type: ignore[attr-defined]
            marks = [pytest.mark.xfail(strict=True, reason=entry.reason)] if entry else []
            params.append(pytest.param(param, id=param.id, marks=marks))
    metafunc.parametrize("harness_case", params)


@pytest.fixture
def harness_run(request: pytest.FixtureRequest):
    """Run a `HarnessCase`, attach its record to the test, and map the outcome to pytest."""

    def run_case(param: HarnessCase) -> None:
        config = request.config
        adapter = config._harness_impls[param.impl]  # type: ignore[attr-defined]
        worker = _case_worker(config)
        if worker is None:
            result = run(param.case, adapter)
        else:
            result = worker.run(param.case, param.impl, ITERATIONS)
            result.impl, result.impl_version = adapter.name, adapter.version
        entry = expectations_mod.find(config._harness_expectations, param.impl, param.case.id,  # type: ignore[attr-defined]
                                      version=adapter.version)
        record = reporting.annotate(result.to_dict(), entry)
        record["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "main")
        record["gpu"] = os.environ.get("CUDA_VISIBLE_DEVICES", "") if param.case.device.value == "cuda" else ""
        request.node.user_properties.append((RESULT_PROPERTY, json.dumps(record)))
        request.node.user_properties.extend(reporting.junit_properties(record))  # for --junitxml
        if result.outcome in (Outcome.UNSUPPORTED, Outcome.SKIPPED):
            pytest.skip(f"{result.outcome.value}: {result.reason}")
        if result.outcome in (Outcome.MISMATCH, Outcome.ERROR, Outcome.CRASH, Outcome.TIMEOUT):
            head = f"{param.impl} {param.case.id}: {result.outcome.value}"
            pytest.fail(f"{head}\n{result.summary()}", pytrace=False)

    return run_case


def _case_worker(config: pytest.Config) -> isolation.CaseWorker | None:
    """This process's isolated case worker, started on first use (None when not isolating)."""
    timeout = config.getoption("case_timeout")
    if not (config.getoption("isolate") or timeout):
        return None
    worker = getattr(config, "_harness_worker", None)
    if worker is None:
        worker = isolation.CaseWorker(timeout or isolation.DEFAULT_TIMEOUT_S)
        config._harness_worker = worker  # type: ignore[attr-defined]
    return worker


def pytest_unconfigure(config: pytest.Config) -> None:
    worker = getattr(config, "_harness_worker", None)
    if worker is not None:
        worker.close()


class ReportCollector:
    """Collects result records where the report is written (the xdist controller or a lone run)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.line = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY:
                record = json.loads(value)
                self.records.setdefault((record["impl"], record["case_id"]), record)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput") or not self.records:
            return  # xdist workers ship records to the controller, which writes the report
        option = self.config.getoption("report_dir")
        target = Path(option) if option else reporting.default_report_dir(self.config.rootpath / "reports")
        try:
            written = reporting.write(list(self.records.values()), target,
                                      expectations=self.config._harness_expectations)  # type: ignore[attr-defined]
        except reporting.ReportError as exc:
            self.line = f"harness report NOT written: {exc}"
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            return
        self.line = f"harness report: {written} ({len(self.records)} cases)"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.line:
            terminalreporter.write_line(self.line)
