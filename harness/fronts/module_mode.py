"""Your own model under test: `python -m harness module PKG.MOD:FACTORY --impl NAME`.

``FACTORY()`` returns a `ModelCase` (or a tuple ``(module, inputs)``): an ``nn.Module`` and its
example inputs (a tensor, a tuple of positional inputs, or a dict of keyword inputs); a factory
may take ``rng_tracker`` (the impl's tracker) and ``checkpointing`` (the model's own
checkpointing, judged under ``--impl as-built``).  This front loads the factory and checks the
arguments (`run_module`); the run itself (three builds, the reference twice, the build under test,
the oracles) is `harness.run.module_run`, and `harness.fronts.module_report` presents its result.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

from ..impls import one_line
from ..model.cases import Capture, Mode
from ..results import AS_BUILT
from ..run.module_run import (
    CHECKPOINTING_PARAMETER,
    AsBuilt,
    ModelCase,
    ModuleError,
    ModuleResult,
    run_factory,
    takes,
)

# What the command line (`cli.cmd_module`) and factories have always found here.
__all__ = ["AS_BUILT", "AsBuilt", "ModelCase", "ModuleError", "ModuleResult", "load_factory", "run_module"]


def load_factory(path: str) -> Callable[..., Any]:
    """The factory ``PKG.MOD:FACTORY`` names; `ModuleError` (one line) when it cannot be had."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ModuleError(f"bad factory {path!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise ModuleError(f"cannot import {module_name!r} for factory {path!r}: {one_line(exc)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModuleError(f"{path}: module {module_name!r} has no callable {attr!r}")
    return factory


def run_module(factory_path: str, impl: Any, device: str = "cpu", capture: Capture = Capture.EAGER,
               mode: Mode = Mode.NONREENTRANT, wrap: list[str] | None = None, iterations: int = 2,
               name: str | None = None) -> ModuleResult:
    """Load the factory ``PKG.MOD:FACTORY`` and run it under `impl` (`module_run.run_factory`).
    Bad input is a `ModuleError`: a factory that cannot be had, ``as-built`` with a factory that
    takes no ``checkpointing`` or with --wrap patterns, and what the run itself finds bad (a
    factory that raises or returns something else, builds that differ, a --wrap that matches
    nothing); everything else is a result."""
    start = time.perf_counter()
    factory = load_factory(factory_path)
    as_built = bool(getattr(impl, "as_built", False))
    if as_built and not takes(factory, CHECKPOINTING_PARAMETER):
        raise ModuleError(f"--impl {AS_BUILT} needs a factory with a parameter {CHECKPOINTING_PARAMETER!r} "
                          f"(False: the model without its own checkpointing, True: with it); {factory_path} has none")
    if as_built and wrap:
        raise ModuleError(f"--wrap does not apply to --impl {AS_BUILT}: the model checkpoints what it checkpoints")
    return run_factory(factory, factory_path, impl, device, capture, mode, wrap, iterations, name, start=start)
