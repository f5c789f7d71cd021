"""The pytest entry point (``pytest11``: ``ckpt_harness``): inert until a project opts in.

Installing ckpt-rng-harness puts this module into every pytest run of the environment, so it must
change nothing there: it imports only the standard library (no torch), adds no option, marker or
ini key, and collects nothing.  A project opts in with pytest's own ``-p ckpt_harness`` (on the
command line, in ``addopts`` of its pytest configuration, or in ``PYTEST_ADDOPTS``); only then is
the harness's plugin (`harness.fronts.plugin`) registered, with its options spelled
``--harness-impl``, ``--harness-device``, ... so that they cannot collide with another plugin's
``--impl`` or ``--device``.  The matrix is then one command::

    pytest -p ckpt_harness --pyargs harness.pytest_cases --harness-impl NAME

(``-p no:ckpt_harness`` keeps the module itself out.)  The checkout's conftest.py registers the
plugin directly and keeps the short spellings (``pytest cases --impl torch``).
"""

from __future__ import annotations

from typing import Any, Sequence

NAME = "ckpt_harness"  # the entry point's name: `-p ckpt_harness` asks for the harness
PLUGIN = "harness.fronts.plugin"


def opted_in(args: Sequence[str]) -> bool:
    """Whether `args` (the command line with ``addopts`` and ``PYTEST_ADDOPTS`` in front, as pytest
    hands them to `pytest_load_initial_conftests`) hold ``-p ckpt_harness`` or ``-pckpt_harness``,
    in pytest's own spellings of ``-p`` and before a ``--`` that ends the options."""
    args = list(args)
    for index, arg in enumerate(args):
        if arg == "--":
            return False
        if arg == "-p" and index + 1 < len(args) and args[index + 1] == NAME:
            return True
        if arg == f"-p{NAME}":
            return True
    return False


def pytest_load_initial_conftests(early_config: Any, parser: Any, args: list[str]) -> None:
    """Register the harness's plugin where the project opted in, before the command line is parsed
    (its options exist by then); nothing otherwise.  Called by pytest for entry-point plugins only."""
    if opted_in(args):
        early_config.pluginmanager.import_plugin(PLUGIN)
