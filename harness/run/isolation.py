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
import threading
import time
from pathlib import Path
from typing import Any

from ..model.cases import Case
from .runner import CaseResult, Outcome, result_from_dict

DEFAULT_TIMEOUT_S = 300.0
_TIMED_OUT = object()
STARTUP_TIMEOUT_S = 300.0  # importing torch (and CUDA) in a fresh worker; not counted per case
TAIL_BYTES = 16384  # how much of the end of the worker's log is read for a failure summary
FATAL_LINES = 12  # faulthandler's report: its "Fatal Python error" line and what follows
LAST_LINES = 8  # otherwise: the last lines of the log
SUMMARY_CHARS = 2000  # whole lines are dropped beyond this (one line is always kept)


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


def _warm_up() -> None:
    """Pay the one-off cost of the first checkpoint call (it imports torch._dynamo, 1.5-4 s).

    Runs on CPU with a 2-element tensor, so it initialises no CUDA context and draws no random
    numbers; a failure here is left for the cases themselves to report.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    try:
        x = torch.zeros(2, requires_grad=True)
        checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    except Exception:  # a broken torch.utils.checkpoint is the torch impl's finding, not start-up's
        pass


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
    import torch  # noqa: F401  (imported before "ready": start-up is not part of a case's time)

    from ..impls import load
    from ..model.cases import parse_case_id
    from .runner import run

    _warm_up()
    protocol.write(json.dumps({"ready": True}) + "\n")
    adapters: dict[str, Any] = {}
    for line in sys.stdin:
        request = json.loads(line)
        name = request["impl"]
        if name not in adapters:
            adapters[name] = load(name)
            _load_code_under_test(adapters[name])
        adapter = adapters[name]
        protocol.write(json.dumps({"started": True}) + "\n")  # the case's clock starts here
        result = run(parse_case_id(request["case"]), adapter, request["iterations"], name=name).to_dict()
        sticky = _sticky_cuda_error() if result["outcome"] != "pass" else None
        protocol.write(json.dumps({"result": result, "sticky": sticky}) + "\n")
        if sticky:
            return  # the CUDA context is unusable: the supervisor starts a fresh worker


def _load_code_under_test(adapter: Any) -> None:
    """Import the impl's package now, as the supervising process did (its `unavailable()`), before
    any case touches CUDA libraries: which process loads a shared library first decides which copy
    the process keeps (seen on the H200: a worker whose first case probed cuDNN attention could no
    longer import TransformerEngine, 'libcudnn_heuristic.so.9: undefined symbol', while the first
    worker, which imported it first, ran every case).  A failure is the adapter's to report."""
    unavailable = getattr(adapter, "unavailable", None)
    if callable(unavailable):
        try:
            unavailable()
        except Exception:  # reported by the case itself (supports / checkpoint), not here
            pass


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

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None) -> None:
        """`env`: variables set in the worker's environment on top of this process's (a
        CUDA_VISIBLE_DEVICES that pins it to one GPU)."""
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self._stopping = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._pending = b""
        self._ready = False  # the process said "ready" (a `start` does not wait for it)
        handle, path = tempfile.mkstemp(prefix="ckpt-harness-worker-", suffix=".log")
        os.close(handle)
        self._stderr = Path(path)
        self.restarts = 0

    def start(self) -> None:
        """Start the worker process now without waiting for it to be ready (it imports torch and
        warms up, seconds): the caller goes on with its own start-up meanwhile, and the first
        `run` waits for the rest.  Does nothing when a process is running already."""
        if self._process is None or self._process.poll() is not None:
            self._stop()
            self._launch()

    def _start(self) -> None:
        self._launch()
        self._await_ready()

    def _launch(self) -> None:
        self._stderr.write_text("")
        self._ready = False
        env = {**os.environ, **self.env}
        # The child must import what the parent can (adapters given as module:factory paths).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # Its stderr goes to the log from the start: an import error before serve() is quoted too.
        with open(self._stderr, "ab") as log:
            self._process = subprocess.Popen(
                self._command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, env=env,
            )
        self._pending = b""

    def _await_ready(self) -> None:
        if not isinstance(self._read_line(STARTUP_TIMEOUT_S), str):
            tail = self._stderr_tail()
            self._stop()
            raise RuntimeError(f"the case worker process did not start: {tail or 'no output'}")
        self._ready = True

    def _command(self) -> list[str]:
        """The worker's command line (tests replace it to make a worker that fails to start)."""
        return [sys.executable, "-m", "harness.run.isolation", str(self._stderr)]

    def _stop(self) -> None:
        # Under a lock: a pool (run.pool) stops its workers from another thread than the one
        # running their case, which may be stopping the same process after seeing it die.
        with self._stopping:
            process, self._process = self._process, None
            if process is not None:
                if process.poll() is None:
                    process.kill()
                process.wait(10)
                for stream in (process.stdin, process.stdout):
                    if stream:
                        stream.close()

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
        """The worker's last words from its log, in whole lines (see `summarize_output`)."""
        return summarize_output(_last_lines(self._stderr))

    def run(self, case: Case, impl_name: str, iterations: int) -> CaseResult:
        """Run one case in the worker; a dead or hung worker gives a crash / timeout result."""
        if self._process is None or self._process.poll() is not None:
            if self._process is not None:
                self.restarts += 1
            self._stop()
            self._start()
        elif not self._ready:  # started early by `start`: wait for the rest of its start-up
            self._await_ready()
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
        process = self._process
        code = process.wait(10) if process is not None else None  # None: stopped by `close`
        return self._failure(case, impl_name, Outcome.CRASH, start,
                             f"worker process died: {_describe_exit(code)}")

    def _failure(self, case: Case, impl_name: str, outcome: Outcome, start: float, what: str) -> CaseResult:
        tail = self._stderr_tail()
        if tail:
            what += f"; its output ended with: {tail}"
        return CaseResult(case, impl_name, outcome, error=what, duration_s=time.perf_counter() - start)


def _last_lines(path: Path) -> list[str]:
    """The complete lines at the end of the file (its last TAIL_BYTES), blank ones left out.

    The first line read is dropped unless the read starts at the top of the file or right after
    a newline: it is the end of a line whose start was not read.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(size - TAIL_BYTES - 1, 0)  # one byte more: was the byte before a newline?
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    if start > 0:
        data = data.partition(b"\n")[2]
    lines = data.decode(errors="replace").splitlines()
    return [line.rstrip() for line in lines if line.strip()]


def summarize_output(lines: list[str]) -> str:
    """The part of a worker's output worth quoting in a result: whole lines only, never a cut one.

    With faulthandler's report of a fatal signal in `lines`, the last "Fatal Python error" line and
    what follows it (FATAL_LINES lines at most); otherwise the last LAST_LINES lines.  Lines are
    then dropped whole (from the end of a fatal report, from the start of a plain tail) while the
    text is longer than SUMMARY_CHARS, but one line always stays.
    """
    fatal = [i for i, line in enumerate(lines) if line.lstrip().startswith("Fatal Python error")]
    if fatal:
        kept = lines[fatal[-1]:][:FATAL_LINES]
        while len(kept) > 1 and len("\n".join(kept)) > SUMMARY_CHARS:
            kept.pop()
    else:
        kept = lines[-LAST_LINES:]
        while len(kept) > 1 and len("\n".join(kept)) > SUMMARY_CHARS:
            kept.pop(0)
    return "\n".join(kept)


if __name__ == "__main__":
    serve(sys.argv[1])
