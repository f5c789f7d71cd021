"""Deliberately faulty adapters for the fault-isolation tests (loaded as faulty_adapters:make_*)."""

from __future__ import annotations

import os
import time

import torch

from harness.impls.bundled import BundledAdapter


class Faulty(BundledAdapter):
    fault = "raise"

    def checkpoint(self, fn, *args, reentrant, tracker):
        if self.fault == "raise":
            raise RuntimeError("faulty adapter: raised on purpose")
        if self.fault == "hang":
            time.sleep(3600)
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


def make_hang():
    return _make("hang")


def make_abort():
    return _make("abort")


def make_segfault():
    return _make("segfault")


def make_device_assert():
    return _make("device-assert")
