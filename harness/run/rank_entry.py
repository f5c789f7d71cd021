"""The two processes a `--ranks N` run starts, each tied to the process that started it, so that
no rank outlives the run whatever ends it (Ctrl-C, SIGKILL, the OOM killer: issue 59).

- ``python -m harness.run.rank_entry launch ARGS``: torch.distributed's own launcher
  (``torch.distributed.run ARGS``), killed by the kernel when the harness process that started it
  dies (``PR_SET_PDEATHSIG``);
- ``python -m harness.run.rank_entry rank SPEC FOLDER``: one rank (`rank_worker`), killed the same
  way when its launcher dies; it asks for that before importing torch (seconds), so a launcher that
  dies while its ranks start (a thousand asked for at once) takes them along too.

Each checks after asking that its parent is still the one that started it: one that died before
the request took hold leaves it under another parent, and it exits at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "HARNESS_RANKS_PARENT"  # the harness process's pid, for the launcher
LAUNCHER_ENV = "HARNESS_RANKS_LAUNCHER"  # the launcher's pid, for its ranks
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHANED_EXIT = 3  # the process that started it was gone before it could tie itself to it


def die_with(parent: int) -> None:
    """Be killed (SIGKILL) when the parent process dies; exit now if `parent` is gone already.
    Linux only: elsewhere the ranks' own check of the harness process (`rank_worker.orders`) is
    what stops them."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(ORPHANED_EXIT)


def main(argv: list[str]) -> int:
    role, rest = argv[0], argv[1:]
    if role == "launch":
        die_with(int(os.environ[PARENT_ENV]))
        os.environ[LAUNCHER_ENV] = str(os.getpid())
        import runpy

        sys.argv = ["torch.distributed.run", *rest]
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        return 0
    if role == "rank":
        die_with(int(os.environ[LAUNCHER_ENV]))
        from .rank_worker import main as rank_main

        return rank_main(rest)
    raise SystemExit(f"harness.run.rank_entry: unknown role {role!r} (launch or rank)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
