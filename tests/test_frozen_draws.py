"""Module mode under capture: a draw on the CPU generator made while a CUDA graph is captured is
frozen into the graph in the reference as much as in the checkpointed run (BART's layer drop,
``torch.rand([])``).  Where that alone explains what differs, the run is not judged (issue 39,
item 5); anything else still fails.  The capture itself needs a GPU: here it is stood in for."""

from __future__ import annotations

import pytest
import torch

from harness.check.records import FORWARD, MaskLog
from harness.results import Mismatch
from harness.run import draws

FROZEN = {"model.decoder (aten::rand)"}


def mismatch(oracle: str, subject: str) -> Mismatch:
    return Mismatch(oracle, subject, 0, 1, 1)


@pytest.mark.parametrize("mismatches, explained", [
    # the frozen draw differs, and what follows from it: gradients, outputs, the CPU generator
    ([mismatch("forward-mask", "model.decoder (aten::rand)"), mismatch("gradient", "input"),
      mismatch("live-stream", "cpu")], True),
    ([mismatch("recompute-mask", "model.decoder (aten::rand) (recompute 1 of 1)"), mismatch("output", "loss")], True),
    # a draw that is not frozen differs too: the checkpoint's doing, judged as ever
    ([mismatch("forward-mask", "model.decoder (aten::rand)"),
      mismatch("recompute-mask", "model.encoder.dropout (aten::native_dropout) (recompute 1 of 1)")], False),
    # the device's stream ends elsewhere: no frozen host draw explains it
    ([mismatch("forward-mask", "model.decoder (aten::rand)"), mismatch("live-stream", "cuda:0")], False),
    # gradients alone: no frozen value differs, so nothing says the capture did it
    ([mismatch("gradient", "input")], False),
    # both runs froze the same value: it repeats every replay, in the reference too (BART's layer
    # drop on an H100, transformers 5.23)
    ([mismatch("fresh-randomness", "model.decoder (aten::rand)")], True),
    # a draw on the device that repeats is stale RNG of the run's own, not a frozen host draw
    ([mismatch("fresh-randomness", "model.decoder (aten::rand)"),
      mismatch("fresh-randomness", "model.encoder.dropout (aten::native_dropout)")], False),
])
def test_only_frozen_draws_and_what_follows_from_them_make_a_run_unjudged(mismatches, explained):
    assert draws.frozen_only(mismatches, FROZEN) is explained
    assert not draws.frozen_only(mismatches, set())


@pytest.mark.parametrize("capturing", [True, False])
def test_the_draw_log_marks_host_draws_made_during_a_capture(monkeypatch, capturing):
    monkeypatch.setattr(draws, "_capturing", lambda: capturing)
    log = MaskLog()
    log.start(0)
    log.phase = FORWARD
    with draws.DrawLog(log, ["model.decoder"], [False]):
        torch.rand([])
    assert log.frozen == ({"model.decoder (aten::rand)"} if capturing else set())
