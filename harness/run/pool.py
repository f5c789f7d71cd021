"""Several isolated case workers at once: one thread per worker process, one queue of cases
(grouped by case: `by_case`).

The cases of the matrix are small, so one worker process leaves a GPU nearly idle while Python,
kernel launches and host syncs take the time (issue 26); N workers, each its own process with its
own CUDA context (graphs and generators are per process), run N cases at a time.  Each worker is an
`isolation.CaseWorker`: a crash, a hang or a sticky CUDA error is that case's result and the worker
is replaced, as with one worker.  Each thread only waits on its worker's pipe, so the GIL is free
for the others; judging a result (`execution.run_case`) happens in the thread that ran it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

from .execution import CaseRun, run_case
from .isolation import DEFAULT_TIMEOUT_S, CaseWorker

Work = Sequence[tuple[Any, Any]]  # (execution.Target, Case) pairs
_DONE = object()


def by_case(work: Work) -> list[list[int]]:
    """The positions in `work`, grouped by case (first appearance first, `work`'s order within a
    group): one worker runs a group's impls one after another, so the case's reference run is made
    once there and reused (`references.REFERENCES`)."""
    groups: dict[str, list[int]] = {}
    for index, (_, case) in enumerate(work):
        groups.setdefault(case.id, []).append(index)
    return list(groups.values())


class CasePool:
    """`len(slots)` isolated case workers; slot i's worker sees only GPU ``slots[i]`` (None: the
    parent's devices, as they are)."""

    def __init__(self, slots: Sequence[str | None], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not slots:
            raise ValueError("a pool needs at least one worker")
        self.slots = list(slots)
        self.workers = [CaseWorker(timeout_s, env=None if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu})
                        for gpu in self.slots]
        for worker in self.workers:  # every process imports torch while the caller gets ready
            worker.start()

    def __len__(self) -> int:
        return len(self.workers)

    def run(self, work: Work, entries: Sequence[Any], on_done: Callable[[int, int, CaseRun], None]) -> None:
        """Run every (target, case) of `work`, a case's impls one after another on one worker
        (`by_case`), calling ``on_done(index in work, worker number,
        CaseRun)`` in this thread as each finishes (in the order they finish).

        A KeyboardInterrupt (Ctrl-C, SIGTERM under `stops.stoppable`) or an exception of `on_done`
        stops the workers and is raised again here; the cases not yet finished are not reported.
        An exception a worker thread meets outside a case (a worker that cannot start) is raised
        here once the other threads have stopped.
        """
        todo: queue.Queue[list[int]] = queue.Queue()
        for group in by_case(work):
            todo.put(group)
        finished: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()

        def serve(number: int, worker: CaseWorker) -> None:
            try:
                while not stop.is_set():
                    try:
                        group = todo.get_nowait()
                    except queue.Empty:
                        break
                    for index in group:
                        if stop.is_set():
                            break
                        target, case = work[index]
                        case_run = run_case(target, case, entries, worker=worker)
                        if not stop.is_set():
                            finished.put((index, number, case_run))
            except BaseException as exc:  # noqa: BLE001 (handed to the main thread, which raises it)
                finished.put(exc)
            finally:
                finished.put(_DONE)

        threads = [threading.Thread(target=serve, args=(n, w), name=f"case-worker-{n}", daemon=True)
                   for n, w in enumerate(self.workers)]
        for thread in threads:
            thread.start()
        running, failure = len(threads), None
        try:
            while running:
                try:
                    item = finished.get(timeout=0.5)  # a timeout, so Ctrl-C is seen while waiting
                except queue.Empty:
                    continue
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    failure = failure or item
                    stop.set()
                else:
                    on_done(*item)
        except BaseException:
            stop.set()
            self.close()  # a worker blocked on its pipe returns once its process is gone
            for thread in threads:
                thread.join(30)
            self.close()  # one that was starting a fresh process as the first close came
            raise
        for thread in threads:
            thread.join(30)
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Stop every worker process (idempotent)."""
        for worker in self.workers:
            worker.close()
