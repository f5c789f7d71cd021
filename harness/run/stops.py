"""How a run stops early and still leaves its report: SIGTERM, Ctrl-C, a second Ctrl-C.

CI systems end a job at its time limit with SIGTERM (then SIGKILL a while later).  While a run's
cases execute, `stoppable` turns SIGTERM into `Terminated`, a KeyboardInterrupt, so the code that
already writes the report of the finished cases after Ctrl-C does the same after SIGTERM; `status`
gives the exit status the shell would show (130 for SIGINT, 143 for SIGTERM).  While that report is
written, `shielded` ignores both signals: a second Ctrl-C no longer leaves a traceback and no
report.  Signal handlers can only be set from the main thread; elsewhere both are no-ops.

Inside `stoppable` both signals are also remembered: code that runs other people's code (an impl's
checkpoint, torch's autograd engine, Hypothesis) may catch the KeyboardInterrupt and go on, so a
loop calls `raise_if_stopped` between cases and the stop is raised again.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
TERMINATED = 143  # ... and by SIGTERM
WRITE_FAILED = 2  # the harness's status for a tool error (bad input, a write that failed)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while cases ran."""


class WriteFailed(KeyboardInterrupt):
    """A judged record could not be written (a full disk): the run stops the way a signal stops
    it, so the code that keeps what finished and writes its report does so here too; exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_stopped: list[BaseException] = []  # the stop that arrived inside the current `stoppable` block


def _raise_stop(signum: int, frame: Any) -> None:
    stop = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    _stopped[:] = [stop]
    raise stop


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM raises `Terminated` and SIGINT KeyboardInterrupt inside the block, and both are
    remembered for `raise_if_stopped` (the previous handlers are put back after)."""
    _stopped.clear()
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stopped() -> BaseException | None:
    """The stop that arrived inside the current `stoppable` block, or None."""
    return _stopped[0] if _stopped else None


def halt(stop: KeyboardInterrupt) -> None:
    """Stop the current `stoppable` block with `stop` (e.g. `WriteFailed`): raised now and again
    by every later `raise_if_stopped`, as a signal would be."""
    _stopped[:] = [stop]
    raise stop


def raise_if_stopped() -> None:
    """Raise the stop that arrived inside the current `stoppable` block again, if one did (the
    code it interrupted may have caught it and gone on)."""
    if _stopped:
        raise _stopped[0]


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside the block: the report of a stopped run gets written."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def status(stop: BaseException) -> int:
    """The exit status for a run stopped by `stop` (143 after SIGTERM, 2 after a failed write, else 130)."""
    if isinstance(stop, WriteFailed):
        return WRITE_FAILED
    return TERMINATED if isinstance(stop, Terminated) else INTERRUPTED


def describe(stop: BaseException) -> str:
    """'terminated (SIGTERM)', 'stopped (<the write that failed>)' or 'interrupted' for the report's marker."""
    if isinstance(stop, WriteFailed):
        return f"stopped ({stop.message})"
    return "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
