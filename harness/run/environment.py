"""The environment a run happens in, probed: versions, GPU, driver, and which RNG APIs this build
has (`environment`).  Every value is a short string, so an environment is one flat JSON object that
rides on each result record (`env`) and survives merges (`report.env` reads it back).
"""

from __future__ import annotations

import platform
import socket
import threading
import warnings
from typing import Any

import torch

from .. import __version__
from ..results import RNG_APIS
from .capture import register_counting_warnings

_probe_lock = threading.Lock()
_probe_result: str | None = None
_register_result: str | None = None


def environment() -> dict[str, Any]:
    """What ran the cases: host, versions, GPU (name, compute capability, count), driver, RNG APIs.

    Keys kept from earlier reports: host, python, torch, cuda, gpu, rng_apis (one string,
    ``name=yes, name=no, ...``).  Cheap: the only CUDA work is the capture probe, once per process.
    """
    env: dict[str, Any] = {
        "harness": __version__,  # which harness judged: its expectations are part of the verdicts
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "gpu": "none",
    }
    apis = {name: "no" for name in RNG_APIS}
    apis["Generator.graphsafe_get_state"] = _yes(hasattr(torch.default_generator, "graphsafe_get_state"))
    graph_type = getattr(torch.cuda, "CUDAGraph", None)
    apis["CUDAGraph.register_generator_state"] = _yes(
        graph_type is not None and hasattr(graph_type, "register_generator_state"))
    apis["Generator.philox_state"] = _yes(hasattr(torch.default_generator, "philox_state"))
    apis["capture-time get_state"] = "unknown (no CUDA)"
    if torch.cuda.is_available():
        try:
            env.update(_cuda_details())
            generator = torch.cuda.default_generators[torch.cuda.current_device()]
            apis["Generator.graphsafe_get_state"] = _yes(hasattr(generator, "graphsafe_get_state"))
            apis["Generator.philox_state"] = _yes(hasattr(generator, "philox_state"))
            apis["capture-time get_state"] = capture_get_state_probe()
            if apis["CUDAGraph.register_generator_state"] == "yes":
                apis["CUDAGraph.register_generator_state"] = register_probe(generator)
        except Exception as exc:  # a broken device must not cost the report
            env["gpu_error"] = _first_line(exc)
            apis["capture-time get_state"] = "unknown (CUDA error)"
    env["rng_apis"] = ", ".join(f"{name}={value}" for name, value in apis.items())
    return env


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _cuda_details() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    count = torch.cuda.device_count()
    details: dict[str, Any] = {
        "gpu": f"{props.name} (sm_{props.major}{props.minor}) x{count}",
        "gpu_name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "gpu_count": str(count),
    }
    driver = getattr(torch._C, "_cuda_getDriverVersion", None)
    if driver is not None:
        version = driver()
        details["driver (CUDA API)"] = f"{version // 1000}.{version % 1000 // 10}"
    kernel_driver = nvidia_driver_version()
    if kernel_driver:
        details["driver"] = kernel_driver
    return details


def nvidia_driver_version() -> str:
    """The NVIDIA kernel driver version (e.g. 570.86.15) from /proc, or "" where it is not readable."""
    try:
        with open("/proc/driver/nvidia/version") as handle:
            text = handle.read()
    except OSError:
        return ""
    for word_list in (line.split() for line in text.splitlines() if "Kernel Module" in line):
        for word in word_list:
            if word[:1].isdigit() and "." in word:
                return word
    return ""


def capture_get_state_probe() -> str:
    """Whether `Generator.get_state()` works during CUDA graph capture: "yes", "no (...)" or "unknown (...)".

    Captures an empty graph on a side stream and calls the current device's default generator's
    `get_state` inside it.  `get_state` only reads the generator, and the generator's value is put
    back afterwards anyway.  Runs once per process (later calls return the cached answer) and never
    while the caller's stream is capturing.
    """
    global _probe_result
    with _probe_lock:
        if _probe_result is None:
            _probe_result = _probe_once()
        return _probe_result


def _probe_once() -> str:
    if not torch.cuda.is_available():
        return "unknown (no CUDA)"
    if not hasattr(torch.cuda, "CUDAGraph"):
        return "unknown (no torch.cuda.CUDAGraph)"
    try:
        if torch.cuda.is_current_stream_capturing():
            return "unknown (asked during a capture)"
        return _capture_and_ask(torch.cuda.default_generators[torch.cuda.current_device()])
    except Exception as exc:  # the probe must never cost the report
        return f"unknown (probe failed: {_first_line(exc)})"


def _capture_and_ask(generator: torch.Generator) -> str:
    before = generator.get_state()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    answer = "unknown"
    try:
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the CUDA graph is empty" is the point here
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                generator.get_state()
                answer = "yes"
            except RuntimeError as exc:
                answer = f"no ({_first_line(exc)})"
            finally:
                graph.capture_end()
    finally:
        del graph
        torch.cuda.current_stream().wait_stream(side)
        generator.set_state(before)  # get_state only reads; this makes sure of it
    return answer


def register_probe(generator: torch.Generator) -> str:
    """Whether `CUDAGraph.register_generator_state` does anything: "yes", or "deprecated no-op
    (warns on every call)" where a call warns (torch >= 2.14 registers generators lazily and kept the
    method only to warn: Megatron-LM PR #7348).  Registers `generator` with a new, never captured
    graph once per process."""
    global _register_result
    with _probe_lock:
        if _register_result is None:
            try:
                warned = register_counting_warnings(torch.cuda.CUDAGraph(), [generator])
                _register_result = "deprecated no-op (warns on every call)" if warned else "yes"
            except Exception as exc:  # the probe must never cost the report
                _register_result = f"unknown (probe failed: {_first_line(exc)})"
        return _register_result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:120]


