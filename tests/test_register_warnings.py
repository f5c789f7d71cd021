"""torch >= 2.14's deprecated `CUDAGraph.register_generator_state` (issue 39, item 4): the harness
counts its warnings per call, whether Python's or the C++ handler's on stderr, and the environment
says whether the method is a no-op.  CPU stand-ins for the graph: no CUDA needed."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from harness.run import capture, environment


class SilentGraph:
    """A graph whose registration works and says nothing (torch <= 2.13)."""

    def __init__(self) -> None:
        self.registered: list[torch.Generator] = []

    def register_generator_state(self, generator: torch.Generator) -> None:
        self.registered.append(generator)


class PythonWarningGraph(SilentGraph):
    def register_generator_state(self, generator: torch.Generator) -> None:
        warnings.warn("register_generator_state is deprecated", FutureWarning, stacklevel=2)


class CppWarningGraph(SilentGraph):
    """As torch 2.14 does it: TORCH_WARN_DEPRECATION through the C++ handler, written to fd 2."""

    def register_generator_state(self, generator: torch.Generator) -> None:
        os.write(2, b"[W1205 10:00:00 CUDAGraph.cpp:97] Warning: register_generator_state is deprecated (function "
                    b"register_generator_state)\n")


def test_a_silent_registration_counts_nothing_and_registers_every_generator():
    graph, generators = SilentGraph(), [torch.Generator(), torch.Generator()]
    assert capture.register_counting_warnings(graph, generators) == 0
    assert graph.registered == generators


@pytest.mark.parametrize("graph_type", [PythonWarningGraph, CppWarningGraph])
def test_every_warning_of_every_call_is_counted_and_kept_out_of_the_log(graph_type, capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escaped the count would raise here
        assert capture.register_counting_warnings(graph_type(), [torch.Generator()] * 3) == 3
        assert capture.register_counting_warnings(graph_type(), [torch.Generator()] * 2) == 2
    assert "deprecated" not in capfd.readouterr().err


def test_after_a_silent_registration_the_next_graphs_register_without_catching_stderr(monkeypatch):
    class QuietGraph(SilentGraph):  # a type of its own: the process remembers silent types
        pass

    first = QuietGraph()
    assert capture.register_counting_warnings(first, [torch.Generator()]) == 0
    monkeypatch.setattr(capture, "stderr_lines", None)  # catching again would raise here
    second, generators = QuietGraph(), [torch.Generator(), torch.Generator()]
    assert capture.register_counting_warnings(second, generators) == 0
    assert second.registered == generators
    with pytest.raises(TypeError):  # a warning type is still caught, call after call
        capture.register_counting_warnings(CppWarningGraph(), [torch.Generator()])


def test_stderr_after_the_block_reaches_the_log_again(capfd):
    with capture.stderr_lines() as lines:
        os.write(2, b"inside\n")
    os.write(2, b"after\n")
    assert lines == ["inside"]
    assert capfd.readouterr().err == "after\n"


@pytest.mark.parametrize("graph_type, said", [
    (SilentGraph, "yes"), (CppWarningGraph, "deprecated no-op (warns on every call)")])
def test_the_environment_says_whether_registration_is_a_no_op(monkeypatch, graph_type, said):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", graph_type)
    monkeypatch.setattr(environment, "_register_result", None)
    assert environment.register_probe(torch.Generator()) == said
