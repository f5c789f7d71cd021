"""The pytest plugin: options, the case matrix, verdicts, and the report.

Registered by the repository's conftest.py (with the short option spellings ``--impl``, ...) or,
in a project that installed the package, by ``-p ckpt_harness`` (`pytest_entry`; options spelled
``--harness-impl``, ...).  Test functions that take the `harness_case` fixture are
parametrized over (impl x case), each marked with its axis values (``-m "tracked and nested"``
selects exactly those cells).  Each runs the case through `execution.run_case`, the function the
command line uses too, and maps the verdict to pytest: pass -> passed; xfail (failed exactly as
the expectations file says) -> xfailed; fail (unexpected, or a wrong failure, or an unsupported
cell of an impl that must support everything) and stale -> failed, with the reason and a rerun
line; skip -> skipped with the reason.  The result record rides on `item.user_properties`, which
pytest-xdist ships from workers to the controller, so the controller alone writes one report for
the run: each record is appended to its results.jsonl as it arrives, and the full report is
written at the end, also after Ctrl-C (marked interrupted, exit status 130) and SIGTERM (marked
terminated, exit status 143).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .. import impls
from .. import report as reporting
from ..model import corpus, shards
from ..model.cases import AXES, ID_PARTS, Case, CaseError, parse_case_id
from ..model.matrix import MATRICES, generate, parse_programs
from ..rank_context import options_problem
from ..report.live import LiveResults
from ..results import CaseRecord, Verdict
from ..run import isolation, stops
from ..run.environment import environment
from ..run.execution import (
    REQUIRE_CUDA_ENV,
    Target,
    UsageError,
    cuda_visible,
    load_targets,
    proved_nothing,
    resolve_devices,
    run_case,
)
from ..run.ranks import RankGroup
from ..verdict import expectations as expectations_mod
from . import gpus

RESULT_PROPERTY = "harness_result"
AXIS_MARKERS = tuple(dict.fromkeys(value.value for enum_type in AXES.values() for value in enum_type))


@dataclass(frozen=True)
class HarnessCase:
    """One parameter of the matrix: an impl name and a case."""

    impl: str
    case: Case

    @property
    def id(self) -> str:
        return f"{self.impl}-{self.case.id}"


PREFIX = "harness-"  # every option: --harness-impl, ...; a global plugin must not take --impl or --device


def _options() -> list[tuple[str, dict[str, Any]]]:
    """Each option of the plugin: its name without dashes or prefix, and its argparse settings
    (the dest is ``harness_<name>``, whichever spelling set it)."""
    return [
        ("impl", dict(action="append", default=[], metavar="NAME",
                      help="implementation(s) under test: a registered name (shipped, or an installed package's "
                           "through the entry-point group harness.implementations) or package.module:factory; "
                           "repeatable or comma-separated; 'all' = every shipped impl (default: bundled)")),
        ("device", dict(default="auto", metavar="DEV",
                        help="auto (cuda if available, else cpu), cpu, cuda, or a comma list")),
        ("report-dir", dict(default=None, metavar="DIR",
                            help="where the report goes (default: reports/<timestamp>-<pid> under the rootdir); a "
                                 f"folder that holds a report is refused unless --{PREFIX}replace-report")),
        ("replace-report", dict(action="store_true", default=False,
                                help="the report folder may hold a report: this run replaces it (its files are "
                                     "removed at the first record)")),
        ("expectations", dict(default=None, metavar="FILE",
                              help="replaces the shipped expected-failures file (cases/expectations.toml in a "
                                   "checkout)")),
        ("add-expectations", dict(action="append", default=[], metavar="FILE",
                                  help="an expectations file whose entries add to the shipped ones and to those "
                                       "installed packages register (harness.expectations); repeatable")),
        ("shard", dict(default=None, metavar="I/N",
                       help="run only shard I of N (deterministic split of impl x case, for CI jobs)")),
        # One default in every front (README, "Isolation"): each case in a replaceable worker process.
        ("isolate", dict(action="store_true", default=True,
                         help="run each case in a replaceable worker process (the default): an abort, segfault, "
                              "hang or sticky CUDA error becomes a crash/timeout result and the run goes on")),
        ("no-isolate", dict(dest="harness_isolate", action="store_false",
                            help="run cases in the pytest process (faster start; a crashing case ends the worker)")),
        ("workers-per-gpu", dict(type=int, default=None, metavar="N",
                                 help="what `-n auto` starts on CUDA: N xdist workers per visible GPU, each with its "
                                      "case worker (default: from the host's cores and the GPU's memory, at most "
                                      f"{gpus.MAX_WORKERS_PER_GPU}; shown in the header)")),
        ("case-timeout", dict(type=float, default=None, metavar="S",
                              help="per-case time limit in seconds when isolated (default 300)")),
        ("matrix", dict(default="default", choices=MATRICES,
                        help="default: first matrix + covering programs; full: every valid program (large)")),
        ("program", dict(action="append", default=[], metavar="NAME",
                         help="only these programs (repeatable or comma-separated), e.g. rand.bf16.odd.keyword.deep")),
        ("ranks", dict(type=int, default=1, metavar="N",
                       help="run each case in N processes forming one parallel layout (as `harness run --ranks N`: "
                            "every rank's oracles plus rank-streams); one group of N per pytest process")),
        ("tp", dict(type=int, default=0, metavar="K",
                    help="with ranks: the tensor-parallel size (default: every rank; TP x CP x DP = N)")),
        ("cp", dict(type=int, default=1, metavar="K", help="with ranks: the context-parallel size (default 1)")),
        ("allow-unsupported", dict(action="store_true", default=False,
                                   help="run an impl named by impl even when its package cannot load (every case "
                                        "unsupported)")),
    ]


def _dest(name: str) -> str:
    return "harness_" + name.replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The options, each spelled ``--harness-<name>`` (`add_checkout_spellings` adds ``--<name>``)."""
    group = parser.getgroup("harness", "checkpoint RNG harness (ckpt-rng-harness)")
    for name, settings in _options():
        group.addoption(f"--{PREFIX}{name}", **{"dest": _dest(name), **settings})


def add_checkout_spellings(parser: pytest.Parser) -> None:
    """The short spellings ``--impl``, ``--device``, ... of every option, for the repository's own
    conftest.py (where no other plugin claims them); each sets the same value as its
    ``--harness-`` twin."""
    group = parser.getgroup("harness")
    for name, settings in _options():
        group.addoption(f"--{name}", **{"dest": _dest(name), **settings, "help": f"= --{PREFIX}{name}"})


def option(config: pytest.Config, name: str) -> Any:
    """The value of option `name` ('impl', 'report-dir'), whichever spelling gave it."""
    return config.getoption(_dest(name))


def flag(config: pytest.Config, name: str) -> str:
    """How the user spells option `name` in this session, so that messages name what was typed:
    ``--<name>`` (the checkout's spelling) where the command line holds a short spelling of any
    harness option and not ``--harness-<name>`` itself, else ``--harness-<name>``."""
    typed = {arg.split("=", 1)[0] for arg in config.invocation_params.args if arg.startswith("--")}
    short = {f"--{option_name}" for option_name, _ in _options()}
    if f"--{PREFIX}{name}" not in typed and typed & short:
        return f"--{name}"
    return f"--{PREFIX}{name}"


def _option_problem(config: pytest.Config) -> str | None:
    """What is wrong with a harness option's value alone, one line (None when nothing)."""
    per_gpu = option(config, "workers-per-gpu")
    if per_gpu is not None and per_gpu < 1:
        return f"{flag(config, 'workers-per-gpu')} must be at least 1, got {per_gpu}"
    problem = options_problem(option(config, "ranks"), option(config, "tp"), option(config, "cp"))
    if problem is None and option(config, "ranks") > 1 and not option(config, "isolate"):
        problem = "--ranks runs every case in rank processes of its own: leave out --no-isolate"
    return problem and _spelled(config, problem, ("ranks", "tp", "cp", "no-isolate"))


def _spelled(config: pytest.Config, message: str, names: tuple[str, ...]) -> str:
    """`message` (written with the short spellings ``--ranks``) with the options spelled as typed."""
    for name in names:
        message = re.sub(rf"(?<![\w-])--{name}\b(?!-)", flag(config, name), message)
    return message


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """Refuse a bad option value in one line (exit 2) before xdist starts workers: `-n auto` asks
    `pytest_xdist_auto_num_workers` inside xdist's own cmdline_main, where an exit is a traceback."""
    problem = _option_problem(config)
    if problem is None:
        return None
    print(f"error: {problem}", file=sys.stderr)
    return 2


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` for CUDA cases: `--workers-per-gpu` (or `gpus.default_workers_per_gpu`) xdist
    workers on every visible GPU; they share each GPU (`gpus.pin_worker`).  None where no case
    runs on CUDA: xdist's own count (the cores) applies."""
    problem = _option_problem(config)
    if problem:  # refused by pytest_cmdline_main already; here only if xdist asked first
        raise pytest.UsageError(problem)
    per_gpu = option(config, "workers-per-gpu")
    try:
        devices = resolve_devices(option(config, "device"))
    except UsageError:
        return None  # said in one line by pytest_configure
    if "cuda" not in devices:
        return None
    ids = gpus.cuda_gpu_ids()
    if per_gpu is None:
        per_gpu, why = gpus.default_workers_per_gpu(len(ids), os.cpu_count() or 1, gpus.gpu_memory_bytes())
    else:
        why = flag(config, "workers-per-gpu")
    config._harness_workers_line = (  # type: ignore[attr-defined]
        f"harness: -n auto on CUDA: {per_gpu * len(ids)} workers, {per_gpu} per GPU on {len(ids)} GPU(s) ({why})")
    return per_gpu * len(ids)


def pytest_report_header(config: pytest.Config) -> str | None:
    return getattr(config, "_harness_workers_line", None)


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: take a GPU of its own before any CUDA call
        config._harness_gpu = gpus.pin_worker(workerinput["workerid"], workerinput["testrunuid"])  # type: ignore[attr-defined]
    for marker in AXIS_MARKERS:
        config.addinivalue_line("markers", f"{marker}: harness cases whose id has the axis value {marker!r}")
    config.addinivalue_line("markers", "spec: harness cases whose program is a spec (fuzzer findings, --program SPEC)")
    try:
        targets = load_targets(option(config, "impl"), allow_unsupported=option(config, "allow-unsupported"))
        config._harness_impls = {t.name: t for t in targets}  # type: ignore[attr-defined]
        if os.environ.get(REQUIRE_CUDA_ENV, "") not in ("", "0") and not cuda_visible():
            raise UsageError(f"{REQUIRE_CUDA_ENV} is set and no CUDA device is visible "
                             "(torch.cuda.is_available() is False): refusing to run the CPU subset instead")
        config._harness_devices = resolve_devices(option(config, "device"))  # type: ignore[attr-defined]
        parse_programs(",".join(option(config, "program")))  # a bad name is one line, here
        corpus.load()  # a corrupt cases/corpus.toml is one line here, not an INTERNALERROR at collection
        entries = expectations_mod.load_all(option(config, "expectations"), option(config, "add-expectations"),
                                            impls.registered())
        shard = option(config, "shard")
        config._harness_shard = shards.parse_shard(shard) if shard else None  # type: ignore[attr-defined]
        expectations_mod.check_impls(entries, impls.registered(), option(config, "expectations"))
        if workerinput is None and option(config, "report-dir"):
            reporting.check_report_dir(option(config, "report-dir"), replace=option(config, "replace-report"),
                                       flag=flag(config, "replace-report"))
        timeout = option(config, "case-timeout")
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise CaseError(f"{flag(config, 'case-timeout')} must be a positive number of seconds, got {timeout:g}")
    except UsageError as exc:  # every bad-input error of the harness (harness.errors)
        pytest.exit(f"error: {exc}", returncode=2)
    config._harness_expectations = entries  # type: ignore[attr-defined]
    collector = ReportCollector(config)
    config.pluginmanager.register(collector, "harness-report")
    if workerinput is None:
        collector.catch_sigterm()
    if workerinput is None:
        for line in expectations_mod.entry_problems(entries, impls.registered()):
            config.issue_config_time_warning(pytest.PytestWarning(f"expectations: {line}"), stacklevel=2)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    params = []
    for impl_name in config._harness_impls:  # type: ignore[attr-defined]
        programs = ",".join(option(config, "program")) or None
        for case in generate(option(config, "matrix"), device=config._harness_devices,  # type: ignore[attr-defined]
                             program=programs):
            if not shards.in_shard(impl_name, case.id, config._harness_shard):  # type: ignore[attr-defined]
                continue
            param = HarnessCase(impl_name, case)
            marks = [getattr(pytest.mark, value) for axis, value in case.axis_values().items()
                     if axis in AXES and value]  # a spec program lacks the factors it varies
            if case.nesting is None:
                marks.append(pytest.mark.spec)
            params.append(pytest.param(param, id=param.id, marks=marks))
    metafunc.parametrize("harness_case", params)


@pytest.fixture
def harness_run(request: pytest.FixtureRequest):
    """Run a `HarnessCase`, attach its record to the test, and map the outcome to pytest."""

    def run_one(param: HarnessCase) -> None:
        config = request.config
        target: Target = config._harness_impls[param.impl]  # type: ignore[attr-defined]
        done = run_case(target, param.case, config._harness_expectations,  # type: ignore[attr-defined]
                        worker=_case_worker(config))
        record = done.record
        record.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        record.gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "") if param.case.device.value == "cuda" else ""
        data = record.to_json()
        # xdist ships user_properties to the controller: the record travels as its JSON line.
        request.node.user_properties.append((RESULT_PROPERTY, json.dumps(data)))
        request.node.user_properties.extend(reporting.junit_properties(data))  # for --junitxml
        verdict, outcome = record.verdict, record.outcome.value
        if verdict is Verdict.SKIP:
            pytest.skip(f"{outcome}: {done.result.reason}")
        if verdict is Verdict.XFAIL:
            pytest.xfail(f"{record.expected_outcome}: {record.expected_failure.splitlines()[0]}")
        if verdict in (Verdict.FAIL, Verdict.STALE):
            lines = [f"{param.impl} {param.case.id}: {outcome} ({verdict.value})"]
            lines += [record.verdict_note] if record.verdict_note else []
            lines += [done.result.summary(), f"rerun: {reporting.repro_command(data)}"]
            pytest.fail("\n".join(line for line in lines if line), pytrace=False)

    return run_one


def _case_worker(config: pytest.Config) -> "isolation.CaseWorker | RankGroup | None":
    """This process's isolated case worker, started on first use (None when not isolating); with
    ``--ranks N`` its group of N ranks (`ranks.RankGroup`, one launch for every case this
    process runs: the ranks are processes of their own, isolated either way)."""
    worker = getattr(config, "_harness_worker", None)
    if worker is not None:
        return worker
    timeout = option(config, "case-timeout") or isolation.DEFAULT_TIMEOUT_S
    if option(config, "ranks") > 1:
        worker = RankGroup(option(config, "ranks"), timeout, option(config, "tp"), option(config, "cp"))
    elif option(config, "isolate"):
        worker = isolation.CaseWorker(timeout)
    config._harness_worker = worker  # type: ignore[attr-defined]
    return worker


def pytest_unconfigure(config: pytest.Config) -> None:
    worker = getattr(config, "_harness_worker", None)
    if worker is not None:
        worker.close()


def _harness_ids(ids: list[str]) -> int:
    """How many of the node ids are harness cases ('...[<impl>-<case id>]')."""
    count = 0
    for node_id in ids:
        param = node_id.rpartition("[")[2].rstrip("]")
        try:
            parse_case_id("-".join(param.split("-")[-len(ID_PARTS):]))
        except CaseError:
            continue
        count += 1
    return count


class ReportCollector:
    """Collects result records where the report is written (the xdist controller or a lone run)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: dict[tuple[str, str], CaseRecord] = {}
        self.line = ""
        self.expected = 0  # harness cases collected: the n of "interrupted after k of n"
        self.live: LiveResults | None = None  # results.jsonl, opened at the first record
        self.stopped_by: BaseException | None = None  # stops.Terminated when SIGTERM ended the session
        self._target: Path | None = None

    def catch_sigterm(self) -> None:
        """SIGTERM (a CI job's time limit) stops the session like Ctrl-C: pytest finishes it and
        the report of the finished cases is written (exit status 143)."""
        def stop(signum: int, frame: Any) -> None:
            self.stopped_by = stops.Terminated()
            raise self.stopped_by

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)

    def target(self) -> Path:
        """The report directory, chosen once (--report-dir, else a new one under reports/)."""
        if self._target is None:
            given = option(self.config, "report-dir")
            self._target = Path(given) if given else reporting.default_report_dir(self.config.rootpath / "reports")
        return self._target

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.expected = _harness_ids([item.nodeid for item in session.items])  # after -k / -m
        if self.expected and getattr(self.config, "workerinput", None) is not None:
            # An xdist worker with harness cases starts its case worker now: the process imports
            # torch and warms up (seconds) while xdist hands out the work, not at the first case.
            worker = _case_worker(self.config)
            if worker is not None:
                worker.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.expected = max(self.expected, _harness_ids(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY:
                record = CaseRecord.from_json(json.loads(value))
                key = (record.impl, record.case_id)
                if key in self.records:
                    continue
                self.records[key] = record
                if not hasattr(self.config, "workerinput"):
                    self._keep(record)

    def _keep(self, record: CaseRecord) -> None:
        """Append the record to the report directory's results.jsonl now (a killed run keeps it).
        A write that fails (a full disk) stops the session as SIGTERM would (`stops.WriteFailed`):
        the records judged are kept and reported where they can be, exit status 2."""
        if self.live is None:
            self.live = LiveResults(self.target(), replace=option(self.config, "replace-report"))
        try:
            self.live.append(record)
        except reporting.ReportWriteError as exc:
            self.stopped_by = stops.WriteFailed(str(exc))
            raise self.stopped_by from None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # xdist workers ship records to the controller, which writes the report
        if self.live is not None:
            self.live.close()
        interrupted = None
        if session.exitstatus == pytest.ExitCode.INTERRUPTED or self.stopped_by is not None:
            stop = self.stopped_by or KeyboardInterrupt()  # pytest keeps no trace of which signal
            interrupted = (f"{stops.describe(stop)} after {len(self.records)} of "
                           f"{max(self.expected, len(self.records))} cases")
            session.exitstatus = stops.status(stop)
        if not self.records:
            self.line = f"harness: {interrupted}: no report written" if interrupted else ""
            return
        try:
            with stops.shielded():  # a second Ctrl-C or SIGTERM must not cost the report
                written, elsewhere = reporting.write_or_fallback(
                    list(self.records.values()), self.target(), environment(), interrupted=interrupted,
                    unmatched=expectations_mod.entry_problems(
                        self.config._harness_expectations,  # type: ignore[attr-defined]
                        impls.registered()))
        except reporting.ReportError as exc:
            self.line = f"harness report NOT written: {exc}"
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            return
        what = f", {interrupted}" if interrupted else ""
        self.line = f"harness report: {written} ({len(self.records)} cases{what})"
        if elsewhere:
            self.line += f"\nharness error: {elsewhere}"
            session.exitstatus = stops.WRITE_FAILED
        targets = list(self.config._harness_impls.values())  # type: ignore[attr-defined]
        idle = [] if interrupted or option(self.config, "allow-unsupported") else \
            proved_nothing(targets, self.records.values())
        if idle:
            self.line += "".join(f"\nharness error: {line}" for line in idle)
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.line:
            terminalreporter.write_line(self.line)
