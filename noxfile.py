"""nox sessions: gpu (the CUDA matrix), cpu (the CPU matrix), tests (the harness's own), lint.

gpu, cpu and tests run in the current environment (no virtualenv) so a GPU runner's CUDA build of
torch is used as it is, never replaced by a download.  Arguments after ``--`` go to pytest, e.g.
``nox -s gpu -- -k tracked --impl torch``.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
DEFAULT_GPU_IMPLS = ["--impl", "bundled", "--impl", "torch"]


def _has_impl(args: list[str]) -> bool:
    return any(a == "--impl" or a.startswith("--impl=") for a in args)


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """The full matrix on CUDA (all capture modes) for bundled and torch, writing a report."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        session.run("python", "-c", probe, silent=True)
    except nox.command.CommandFailed:
        session.error("no CUDA device is visible (torch.cuda.is_available() is False)")
    args = list(session.posargs)
    impl_args = [] if _has_impl(args) else DEFAULT_GPU_IMPLS
    session.run("python", "-m", "pytest", "cases", "--device", "cuda", *impl_args, *args)


@nox.session(python=False)
def cpu(session: nox.Session) -> None:
    """The CPU matrix (eager cases) for the impls given (default bundled), writing a report."""
    session.run("python", "-m", "pytest", "cases", "--device", "cpu", *session.posargs)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The harness's own tests plus the CPU matrix, as CI runs them."""
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff format check and lint."""
    session.install("ruff")
    session.run("ruff", "check", "harness", "tests", "cases", "noxfile.py", "conftest.py")
