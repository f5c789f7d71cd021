"""One exception base (harness.errors): every error class the harness defines derives from it, and
every bad-input class from its UsageError, which the fronts print as one line with exit 2."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import harness
from harness.errors import HarnessError, UsageError
from harness.fronts.cli import main

# Outside on purpose (harness.errors says why): the bundled checkpoint is a library of its own; the
# fuzzer's Found is control flow inside Hypothesis; stops.Terminated is SIGTERM as a
# KeyboardInterrupt, which `except Exception` in code under test must not catch; stops.WriteFailed
# (a record that could not be written) is one too, so a run stops and reports as after SIGTERM.
OUTSIDE = ("harness.checkpoint",)
CONTROL_FLOW = {"harness.fronts.fuzz.Found", "harness.run.stops.Terminated", "harness.run.stops.WriteFailed"}


def harness_exception_classes() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(harness.__path__, "harness."):
        if info.name.startswith(OUTSIDE) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_error_class_of_the_harness_derives_from_one_base():
    classes = harness_exception_classes()
    assert len(classes) >= 14, sorted(classes)
    outside = [name for name, cls in classes.items() if not issubclass(cls, HarnessError) and name not in CONTROL_FLOW]
    assert outside == []


def test_every_bad_input_class_is_a_usage_error_and_a_value_error_as_before():
    classes = harness_exception_classes()
    usage = {name for name, cls in classes.items() if issubclass(cls, UsageError)}
    for name in ("harness.model.cases.CaseError", "harness.model.programs.ProgramError", "harness.impls.ImplError",
                 "harness.model.shards.ShardError", "harness.verdict.expectations.ExpectationError",
                 "harness.run.module_run.ModuleError", "harness.model.corpus.CorpusError",
                 "harness.report.ReportError", "harness.verdict.models.ModelError"):
        assert name in usage, name
    assert all(issubclass(classes[name], ValueError) for name in usage)


def test_each_kind_of_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    for argv in (["run", "--impl", "no-such-impl", "--device", "cpu"],  # ImplError
                 ["run", "--layout", "sideways", "--device", "cpu"],  # CaseError
                 ["run", "--shard", "3/2", "--device", "cpu"],  # ShardError
                 ["report", str(tmp_path / "nothing-here")]):  # the report commands' usage error
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, (argv, err)
