"""Executors: eager, separate graphs, one graph.  The reference and the checkpointed run share them.

An executor drives a `Step` (forward, interleaved draws, backward, reseed, collect) for K
iterations:

* eager: K x (forward, draws, backward);
* separate: warm up on a side stream, capture the forward in one CUDA graph and the backward (with
  the recompute) in another, reseed, then K x (replay forward, draws eagerly, replay backward), as
  `make_graphed_callables` does;
* single: warm up, capture forward + draws + backward in one graph, reseed, then K replays.

Masks are recorded capture-safely: during capture `MaskLog.record` clones into tensors of the
graph's pool, and after every replay `Step.collect` copies those static buffers out.  Tracker
streams are registered with every graph where the torch build has `register_generator_state`
(warnings counted: `REGISTER_WARNINGS`).
Each case releases its graphs (and their memory pools) before returning.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from typing import Iterator, Protocol, Sequence

import torch

from ..model.cases import Capture

WARMUP_ITERATIONS = 2


class Step(Protocol):
    """What an executor needs from a run (implemented by runner.RunSession)."""

    def begin_iteration(self, iteration: int) -> None:
        """Start iteration `iteration` (negative: warm-up or capture), gradients cleared."""

    def forward(self) -> torch.Tensor:
        """The forward pass; returns the loss."""

    def between(self, cpu: bool = True, device: bool = True) -> None:
        """The interleaved draws from the CPU generator and/or the device's streams (if any)."""

    def draws_between(self) -> bool:
        """Whether the case draws between forward and backward at all."""

    def backward(self, loss: torch.Tensor) -> None:
        """Backward from `loss` (the recompute happens here)."""

    def reseed(self) -> None:
        """Every stream back to the run's initial state, in place."""

    def generators(self) -> Sequence[torch.Generator]:
        """Tracker generators to register with each CUDA graph."""

    def collect(self, iteration: int) -> None:
        """Copy this iteration's records out (after a replay, out of the graph's buffers)."""


def run_eager(step: Step, iterations: int) -> None:
    """K x (forward, interleaved draws, backward), recording each iteration as it happens."""
    for it in range(iterations):
        step.begin_iteration(it)
        loss = step.forward()
        step.between()
        step.backward(loss)
        step.collect(it)


# Warnings `register_generator_state` gave in this process.  torch >= 2.14 registers generators
# lazily and made the method a deprecated no-op that warns on every call through torch's C++
# warning handler, which Python's filters do not see (Megatron-LM PR #7348: the flood killed its CI
# log collection).  The harness still calls it where it exists, as Megatron's and TE's graph runners
# do, keeps the warnings out of the log and counts them: the runner records a case's share.
REGISTER_WARNINGS = [0]


def _new_graph(step: Step) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    if hasattr(graph, "register_generator_state"):
        cuda = [gen for gen in step.generators() if gen.device.type == "cuda"]
        REGISTER_WARNINGS[0] += register_counting_warnings(graph, cuda)
    return graph


# Graph types whose registration gave no warning in this process.  A torch's method warns on every
# call or never, so once a call was silent the next ones register directly: catching fd 2 costs a
# temporary file and two dup2 calls, 1.6 ms a graph on the H100 (issue 42), more than a small
# case's capture itself.
_SILENT_REGISTRATION: set[type] = set()


def register_counting_warnings(graph: object, generators: Sequence[torch.Generator]) -> int:
    """Register each of `generators` with `graph`; returns how many warnings the calls gave, as
    Python warnings or as lines torch's C++ handler wrote to stderr (both kept out of the log).
    Where a registration with this type of graph was silent before, registers without looking."""
    if type(graph) in _SILENT_REGISTRATION:
        for gen in generators:
            graph.register_generator_state(gen)
        return 0
    with warnings.catch_warnings(record=True) as caught, stderr_lines() as written:
        warnings.simplefilter("always")
        for gen in generators:
            graph.register_generator_state(gen)
    warned = len(caught) + sum(1 for line in written if "Warning" in line)
    if generators and not warned:
        _SILENT_REGISTRATION.add(type(graph))
    return warned


@contextlib.contextmanager
def stderr_lines() -> "Iterator[list[str]]":
    """The lines written to file descriptor 2 inside the block (C++ code writes there, past
    `sys.stderr`), given as a list filled when the block ends; nothing of them reaches the log."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


_WARMUP_STREAMS: dict[int, torch.cuda.Stream] = {}


def warmup_stream() -> torch.cuda.Stream:
    """The side stream every warm-up on the current device runs on, one per process and device.
    cuBLAS keeps a workspace (32 MiB on an H200) for every stream it runs on, and
    ``torch.cuda.Stream()`` hands out the streams of a pool of 32 in turn: a new side stream per run
    held about 1 GiB of allocated device memory after one pass of the CUDA matrix (issue 26)."""
    device = torch.cuda.current_device()
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream()
    return _WARMUP_STREAMS[device]


def _warm_up(step: Step, single: bool) -> None:
    """Eager iterations on a side stream, so lazy initialisation happens outside capture."""
    side = warmup_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_ITERATIONS):
            step.begin_iteration(-1)
            loss = step.forward()
            step.between(cpu=not single)
            step.backward(loss)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


@contextlib.contextmanager
def _released(graphs: list[torch.cuda.CUDAGraph]) -> Iterator[list[torch.cuda.CUDAGraph]]:
    try:
        yield graphs
    finally:
        for graph in graphs:
            graph.reset()  # frees the graph; its private pool goes once its tensors are dropped
        graphs.clear()


def run_single(step: Step, iterations: int) -> None:
    """Forward, in-graph draws and backward captured in one graph; K replays."""
    with _released([]) as graphs:
        _warm_up(step, single=True)
        graph = _new_graph(step)
        graphs.append(graph)
        step.begin_iteration(-2)  # clears grads: backward under capture allocates static buffers
        with torch.cuda.graph(graph):
            loss = step.forward()
            step.between(cpu=False)  # a CPU draw would run once at capture, not per replay
            step.backward(loss)
        step.reseed()
        for it in range(iterations):
            graph.replay()
            torch.cuda.synchronize()
            step.collect(it)
        del loss


def run_separate(step: Step, iterations: int) -> None:
    """Forward graph and backward graph (recompute inside), replayed in order.

    Interleaved draws run as another micro-batch's graph would: a third graph that draws from
    every CUDA stream, replayed between the forward and backward replays (plus an eager CPU draw).
    Its replay refills the generators' device-side seed/offset, which is what a host-side rewind
    in the backward graph cannot see.  (Up to torch 2.13 a generator has one pair of device
    tensors, and a backward graph whose net RNG increment is zero does not refill them on replay,
    so without other graphs in between a host-side rewind lines up by luck; from 2.14 every capture
    has its own pair and it never does.)
    """
    with _released([]) as graphs:
        _warm_up(step, single=False)
        forward_graph, backward_graph = _new_graph(step), _new_graph(step)
        graphs += [forward_graph, backward_graph]
        step.begin_iteration(-2)  # clears grads: backward under capture allocates static buffers
        with torch.cuda.graph(forward_graph):
            loss = step.forward()
        with torch.cuda.graph(backward_graph):
            step.backward(loss)
        draws_graph = None
        if step.draws_between():
            draws_graph = _new_graph(step)
            graphs.append(draws_graph)
            with torch.cuda.graph(draws_graph):
                step.between(cpu=False)
        step.reseed()
        for it in range(iterations):
            forward_graph.replay()
            if draws_graph is not None:
                step.between(device=False)
                draws_graph.replay()
            backward_graph.replay()
            torch.cuda.synchronize()
            step.collect(it)
        del loss


EXECUTORS = {Capture.EAGER: run_eager, Capture.SEPARATE: run_separate, Capture.SINGLE: run_single}


def execute(capture: Capture, step: Step, iterations: int) -> None:
    """Run `step` under the executor of `capture`."""
    EXECUTORS[capture](step, iterations)
