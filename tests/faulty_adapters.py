"""Deliberately faulty adapters for the fault-isolation and loading tests (faulty_adapters:make_*)."""

from __future__ import annotations

import os
import sys
import time

import torch

from harness.impls.bundled import BundledAdapter

# Lines with long paths, as a failing build or a deprecation warning would print them: a summary of
# the worker's output must quote them whole.
NOISE_LINES = 30


def noise_line(i: int) -> str:
    """Line `i` of the noisy adapters' stderr output (about 230 characters, mostly one path)."""
    folder = "/".join(f"very-long-directory-name-{k:02d}" for k in range(6))
    return f"warning {i:02d}: /opt/site-packages/{folder}/module_{i:02d}.py:{100 + i}: something odd"


def _print_noise() -> None:
    for i in range(NOISE_LINES):
        print(noise_line(i), file=sys.stderr)
    sys.stderr.flush()


class Faulty(BundledAdapter):
    fault = "raise"
    calls = 0  # checkpoint calls in this process (swallow-ctrl-c)
    dynamo_at_load = None  # set by make_dynamo_probe

    def checkpoint(self, fn, *args, reentrant, tracker, **kwargs):
        if self.fault == "out-of-memory":  # as a GPU shared with other processes does
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        if kwargs:
            return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)
        if self.fault == "dynamo-probe":
            raise RuntimeError(f"torch._dynamo imported before the case: {self.dynamo_at_load}")
        if self.fault in ("noisy-exit", "noisy-abort"):
            _print_noise()
            if self.fault == "noisy-exit":
                os._exit(3)
            os.abort()
        if self.fault == "raise":
            raise RuntimeError("faulty adapter: raised on purpose")
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "swallow-ctrl-c":
            Faulty.calls += 1
            if Faulty.calls == 6:  # a few cases in: wait for Ctrl-C, eat it, and finish the case
                print("faulty adapter: waiting for Ctrl-C, which it will swallow", flush=True)
                try:
                    time.sleep(3600)
                except KeyboardInterrupt:
                    pass
        if self.fault == "abort":
            os.abort()
        if self.fault == "segfault":
            import ctypes

            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if self.fault == "device-assert":  # a sticky CUDA error (needs a GPU)
            index = torch.tensor([10**6], device="cuda")
            torch.zeros(4, device="cuda")[index].sum().item()
        return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker)


def _make(fault: str):
    adapter = Faulty()
    adapter.name, adapter.fault = f"faulty-{fault}", fault
    return adapter


def make_raise():
    return _make("raise")


def make_out_of_memory():
    return _make("out-of-memory")


def make_hang():
    return _make("hang")


def make_swallow_ctrl_c():
    """Like bundled, but its sixth checkpoint call waits for Ctrl-C and swallows it (as code that
    catches KeyboardInterrupt would), then finishes the case."""
    return _make("swallow-ctrl-c")


def make_abort():
    return _make("abort")


def make_segfault():
    return _make("segfault")


def make_device_assert():
    return _make("device-assert")


def make_noisy_exit():
    """Prints NOISE_LINES long lines to stderr, then exits with status 3 (no faulthandler report)."""
    return _make("noisy-exit")


def make_noisy_abort():
    """Prints NOISE_LINES long lines to stderr, then aborts (a faulthandler report follows)."""
    return _make("noisy-abort")


def make_dynamo_probe():
    """Raises, naming whether torch._dynamo was imported when the worker loaded this adapter."""
    adapter = _make("dynamo-probe")
    adapter.dynamo_at_load = "torch._dynamo" in sys.modules
    return adapter


# --- factories that fail (loading errors) ---------------------------------------------------------


def make_raising_factory():
    raise RuntimeError("factory failed\n  on purpose")


def make_exiting_factory():
    sys.exit(4)


def make_interrupted_factory():
    raise KeyboardInterrupt


class _Wordy:
    """Not an adapter, with a long multi-line repr."""

    def __repr__(self):
        return "<Wordy\n" + "word " * 200 + ">"


def make_not_an_adapter():
    return _Wordy()


# --- adapters that break the contract in other ways (supports(), what checkpoint returns) ----------


class DeclineAll(BundledAdapter):
    """Declares every case unsupported; not one of the impls that must support everything."""

    name = "decline-all"
    must_support_all = False

    def supports(self, case):
        return "declines everything"


def make_decline_all():
    return DeclineAll()


DECLINED_CASE = "reentrant-default-eager-flat-none-cpu"


class BundledDecliningOne(BundledAdapter):
    """The bundled checkpoint (must_support_all stays True) declaring one case unsupported."""

    name = "bundled-declining-one"

    def supports(self, case):
        return "declined on purpose" if case.id == DECLINED_CASE else None


def make_bundled_declining_one():
    return BundledDecliningOne()


class SupportsRaises(BundledAdapter):
    name = "supports-raises"

    def supports(self, case):
        raise ValueError("bad supports")


def make_supports_raises():
    return SupportsRaises()


class Exits(BundledAdapter):
    name = "exits"

    def checkpoint(self, fn, *args, reentrant, tracker):
        raise SystemExit(3)


def make_exits():
    return Exits()


class ReturnsTuple(BundledAdapter):
    name = "returns-tuple"

    def checkpoint(self, fn, *args, reentrant, tracker):
        out = super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker)
        return (out, out)


def make_returns_tuple():
    return ReturnsTuple()


class ReturnsWrongShape(BundledAdapter):
    name = "returns-wrong-shape"

    def checkpoint(self, fn, *args, reentrant, tracker):
        out = super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker)
        return out[:1]


def make_returns_wrong_shape():
    return ReturnsWrongShape()


# The adapters above that break the adapter contract, as given to --impl -> the start of the error
# line their case must report (the command line and the pytest plugin alike).
ADAPTER_FAULTS = {
    "faulty_adapters:make_supports_raises":
        "AdapterFault: adapter 'faulty_adapters:make_supports_raises': supports() raised ValueError: bad supports",
    "faulty_adapters:make_exits": "SystemExit: 3",
    "faulty_adapters:make_returns_tuple":
        "AdapterFault: adapter 'faulty_adapters:make_returns_tuple': checkpoint returned a tuple of 2 "
        "(Tensor, Tensor), expected ",
    "faulty_adapters:make_returns_wrong_shape":
        "AdapterFault: adapter 'faulty_adapters:make_returns_wrong_shape': checkpoint returned a torch.float32 "
        "tensor of shape (1, 64) on cpu, expected a torch.float32 tensor of shape (64, 64) on cpu",
}


class BundledDecliningAll(BundledAdapter):
    """The bundled checkpoint (must_support_all stays True) declaring everything unsupported,
    with no limit declared."""

    name = "bundled-declining-all"

    def supports(self, case):
        return "declined on purpose"


def make_bundled_declining_all():
    return BundledDecliningAll()


class RankOneFails(BundledAdapter):
    """On rank 1 only, in the cases whose program is `program`: dies (``die``) or hangs (``hang``)
    inside the checkpoint, the way one rank of a group fails; every other rank and case is bundled."""

    def __init__(self, fault: str, program: str) -> None:
        super().__init__()
        self.fault, self.program = fault, program
        self.name = f"rank-one-{fault}s"

    def checkpoint(self, fn, *args, reentrant, tracker, **kwargs):
        from harness.rank_context import current

        if current().rank == 1 and self.case_program == self.program:
            if self.fault == "die":
                os._exit(7)
            time.sleep(3600)
        return super().checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, **kwargs)

    def supports(self, case):
        self.case_program = case.program.name
        return super().supports(case)


def make_rank_one_dies():
    return RankOneFails("die", "nested")


def make_rank_one_hangs():
    return RankOneFails("hang", "nested")


class NoCpu(BundledAdapter):
    """bundled, declaring the CPU a limit (as a CUDA-only impl does): nothing to fuzz on a CPU."""

    name = "no-cpu"

    def declared_limits(self):
        from harness.impls.limits import Axis, limit
        from harness.model.cases import Device

        return (limit(Axis.DEVICE, [Device.CPU], "CUDA-only"),)


def make_no_cpu():
    return NoCpu()
