"""Fault isolation: run cases in a worker process that the harness can lose and replace.

A case that aborts or segfaults its process, leaves a sticky CUDA error behind, or hangs past its
time limit becomes a `crash` or `timeout` result with what was seen (exit signal, the tail of the
worker's stderr, the CUDA error); the supervisor starts a fresh worker and the run goes on.  The
worker is a `spawn` child, so it inherits the parent's environment (CUDA_VISIBLE_DEVICES pinning
included) but no CUDA state.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .cases import Case
from .runner import CaseResult, Outcome, result_from_dict

DEFAULT_TIMEOUT_S = 300.0
_TIMED_OUT = object()
STARTUP_TIMEOUT_S = 300.0  # importing torch (and CUDA) in a fresh worker; not counted per case
STDERR_TAIL = 2000


def _sticky_cuda_error() -> str | None:
    """After a failed CUDA case: the error a synchronize raises, if the context is broken."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # a device-side assert or an illegal access poisons the context
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def serve(stderr_path: str) -> None:
    """Worker loop: read JSON requests on stdin, answer one JSON line each on the original stdout.

    Everything the code under test prints (stdout and stderr) goes to `stderr_path`, so it can
    neither corrupt the protocol nor be lost when the process dies.
    """
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable()  # a fatal signal leaves its Python traceback in the log
    from .cases import parse_case_id
    from .impls import load
    from .runner import run

    import torch  # noqa: F401  (imported before "ready": start-up is not part of a case's time)

    protocol.write(json.dumps({"ready": True}) + "\n")
    adapters: dict[str, Any] = {}
    for line in sys.stdin:
        request = json.loads(line)
        name = request["impl"]
        adapter = adapters[name] if name in adapters else adapters.setdefault(name, load(name))
        protocol.write(json.dumps({"started": True}) + "\n")  # the case's clock starts here
        result = run(parse_case_id(request["case"]), adapter, request["iterations"]).to_dict()
        sticky = _sticky_cuda_error() if result["outcome"] != "pass" else None
        protocol.write(json.dumps({"result": result, "sticky": sticky}) + "\n")
        if sticky:
            return  # the CUDA context is unusable: the supervisor starts a fresh worker


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit {code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class CaseWorker:
    """Runs cases one at a time in a replaceable child process, with a per-case time limit."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._pending = b""
        handle, path = tempfile.mkstemp(prefix="ckpt-harness-worker-", suffix=".log")
        os.close(handle)
        self._stderr = Path(path)
        self.restarts = 0

    def _start(self) -> None:
        self._stderr.write_text("")
        env = dict(os.environ)
        # The child must import what the parent can (adapters given as module:factory paths).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.isolation", str(self._stderr)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self._pending = b""
        if not isinstance(self._read_line(STARTUP_TIMEOUT_S), str):
            tail = self._stderr_tail()
            self._stop()
            raise RuntimeError(f"the case worker process did not start: {tail[-600:] or 'no output'}")

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(10)
            for stream in (self._process.stdin, self._process.stdout):
                if stream:
                    stream.close()
        self._process = None

    def close(self) -> None:
        """Stop the worker process (idempotent)."""
        self._stop()
        self._stderr.unlink(missing_ok=True)

    def _read_line(self, timeout_s: float) -> "str | None | object":
        """The worker's next protocol line; None at end of file, _TIMED_OUT after `timeout_s`.

        Reads the pipe's file descriptor directly: a buffered reader could hold a complete line
        that `select` then never reports as readable.
        """
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(remaining, 0))
            if not ready:
                return _TIMED_OUT
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode()

    def _stderr_tail(self) -> str:
        try:
            return self._stderr.read_text(errors="replace")[-STDERR_TAIL:].strip()
        except OSError:
            return ""

    def run(self, case: Case, impl_name: str, iterations: int) -> CaseResult:
        """Run one case in the worker; a dead or hung worker gives a crash / timeout result."""
        if self._process is None or self._process.poll() is not None:
            if self._process is not None:
                self.restarts += 1
            self._stop()
            self._start()
        assert self._process is not None and self._process.stdin and self._process.stdout
        start = time.perf_counter()
        request = {"case": case.id, "impl": impl_name, "iterations": iterations}
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            return self._died(case, impl_name, start)
        if not isinstance(self._read_line(STARTUP_TIMEOUT_S), str):  # loading the impl is not the case's time
            return self._died(case, impl_name, start)
        line = self._read_line(self.timeout_s)
        if line is _TIMED_OUT:
            self._stop()
            self.restarts += 1
            return self._failure(case, impl_name, Outcome.TIMEOUT, start,
                                 f"no result within {self.timeout_s:g} s; the worker was killed")
        if line is None:
            return self._died(case, impl_name, start)
        answer = json.loads(line)
        result = result_from_dict(answer["result"])
        if answer["sticky"]:
            self._stop()
            result.outcome = Outcome.CRASH
            result.error = f"sticky CUDA error after the case: {answer['sticky']}" + (
                f" (the case itself: {result.error})" if result.error else "")
        return result

    def _died(self, case: Case, impl_name: str, start: float) -> CaseResult:
        assert self._process is not None
        code = self._process.wait(10)
        return self._failure(case, impl_name, Outcome.CRASH, start,
                             f"worker process died: {_describe_exit(code)}")

    def _failure(self, case: Case, impl_name: str, outcome: Outcome, start: float, what: str) -> CaseResult:
        tail = self._stderr_tail()
        fatal = tail.rfind("Fatal Python error")  # faulthandler's report of the fatal signal
        tail = tail[fatal:][:800] if fatal >= 0 else tail[-600:]
        if tail:
            what += f"; its output ended with: {tail}"
        return CaseResult(case, impl_name, outcome, error=what, duration_s=time.perf_counter() - start)


if __name__ == "__main__":
    serve(sys.argv[1])
