"""The bundled checkpoint on CPU, both flavours: bitwise equality with a plain run, real
recomputation, nesting, live-stream restoration, tracker streams, and errors in the recompute.

Every run draws from the CPU generator between forward and backward (as another micro-batch
would), so a checkpoint that forgot to restore the streams after its recompute cannot pass by
accident.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

from harness.check.compare import bitwise_diff
from harness.checkpoint import RNGStatesTracker, checkpoint

SHAPE = (8, 8)
SEED = 1234
STREAM = "mp"

pytestmark = pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "nonreentrant"])


@pytest.fixture(autouse=True)
def _restore_cpu_rng():
    with torch.random.fork_rng(devices=[]):
        yield


def same_bits(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bitwise_diff(got, expected, oracle="test", subject="t", iteration=0) is None


@dataclass
class Run:
    """What one forward + backward left behind."""

    output: torch.Tensor
    grads: dict[str, torch.Tensor]
    cpu_state: torch.Tensor
    calls: dict[str, int] = field(default_factory=dict)
    masks: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    tracker_state: torch.Tensor | None = None


class Model:
    """Dropout sites with weights; counts region calls and records every mask drawn."""

    def __init__(self, ckpt: Callable[..., Any] | None, tracker: RNGStatesTracker | None = None):
        gen = torch.Generator().manual_seed(0)
        self.weights = {n: (torch.rand(SHAPE, generator=gen) + 0.5).requires_grad_(True)
                        for n in ("w0", "w1", "w2")}
        self.x = (torch.rand(SHAPE, generator=gen) + 0.5).requires_grad_(True)
        self.ckpt, self.tracker = ckpt, tracker
        self.calls: dict[str, int] = {}
        self.masks: dict[str, list[torch.Tensor]] = {}

    def site(self, name: str, h: torch.Tensor, weight: str, stream: str | None = None):
        if stream is None:
            h, mask = torch.native_dropout(h, 0.5, True)
        else:
            with self.tracker.fork(stream):
                h, mask = torch.native_dropout(h, 0.5, True)
        self.masks.setdefault(name, []).append(mask.detach().clone())
        return h * self.weights[weight]

    def region(self, name: str, body: Callable[[torch.Tensor], torch.Tensor]):
        def fn(h: torch.Tensor) -> torch.Tensor:
            self.calls[name] = self.calls.get(name, 0) + 1
            return body(h)

        return lambda h: fn(h) if self.ckpt is None else self.ckpt(fn, h)


def run(build: Callable[[Model], Callable[[torch.Tensor], torch.Tensor]], ckpt, tracker=None,
        between: Callable[[], None] | None = None) -> Run:
    """Seed, forward, draw in between, backward; return outputs, grads and RNG states."""
    torch.manual_seed(SEED)
    model = Model(ckpt, tracker)
    forward = build(model)
    out = forward(model.x)
    torch.rand(17)  # another micro-batch moves the CPU generator
    if between is not None:
        between()
    out.sum().backward()
    grads = {"x": model.x.grad, **{n: w.grad for n, w in model.weights.items()}}
    return Run(
        out.detach(), grads, torch.default_generator.get_state(), dict(model.calls),
        model.masks, tracker.get_states()[STREAM] if tracker is not None else None,
    )


def ckpt_fn(reentrant: bool, tracker=None):
    return lambda fn, *args: checkpoint(fn, *args, reentrant=reentrant, tracker=tracker)


def flat(model: Model):
    return model.region("r0", lambda h: model.site("s1", model.site("s0", h, "w0"), "w1"))


def nested(model: Model):
    inner = model.region("inner", lambda h: model.site("s1", h, "w1"))
    return model.region(
        "outer", lambda h: model.site("s2", inner(model.site("s0", h, "w0")), "w2")
    )


def assert_same_run(got: Run, expected: Run) -> None:
    assert same_bits(got.output, expected.output), "output differs"
    assert expected.grads["x"] is not None
    for name, grad in expected.grads.items():
        if grad is None:  # a weight the workload does not use
            assert got.grads[name] is None, name
            continue
        assert got.grads[name] is not None, f"no gradient for {name}"
        assert same_bits(got.grads[name], grad), f"gradient of {name} differs"
    assert same_bits(got.cpu_state, expected.cpu_state), "CPU generator differs after backward"


# --- flat region --------------------------------------------------------------------------------


def test_flat_region_equals_plain_run(reentrant):
    assert_same_run(run(flat, ckpt_fn(reentrant)), run(flat, None))


def test_flat_region_is_recomputed_once(reentrant):
    torch.manual_seed(SEED)
    model = Model(ckpt_fn(reentrant))
    out = flat(model)(model.x)
    assert model.calls == {"r0": 1}
    out.sum().backward()
    assert model.calls == {"r0": 2}


def test_recompute_redraws_the_forward_masks(reentrant):
    result = run(flat, ckpt_fn(reentrant))
    for site in ("s0", "s1"):
        forward, recompute = result.masks[site]
        assert same_bits(recompute, forward), site


def test_masks_are_random(reentrant):
    # guards the tests above: a dropout that drew nothing would make every mask compare equal
    result = run(flat, ckpt_fn(reentrant))
    s0, s1 = result.masks["s0"][0], result.masks["s1"][0]
    assert 0 < int(s0.sum()) < s0.numel()
    assert not same_bits(s0, s1)


def test_cpu_generator_after_backward_equals_reference(reentrant):
    assert same_bits(run(flat, ckpt_fn(reentrant)).cpu_state, run(flat, None).cpu_state)


# --- nesting ------------------------------------------------------------------------------------


def test_nested_regions_equal_plain_run(reentrant):
    assert_same_run(run(nested, ckpt_fn(reentrant)), run(nested, None))


def test_nested_regions_are_recomputed(reentrant):
    result = run(nested, ckpt_fn(reentrant))
    assert result.calls["outer"] == 2
    assert result.calls["inner"] >= 2


def test_nested_recomputes_redraw_every_forward_mask(reentrant):
    result = run(nested, ckpt_fn(reentrant))
    for site, masks in result.masks.items():
        assert len(masks) >= 2, site
        for n, mask in enumerate(masks[1:], start=1):
            assert same_bits(mask, masks[0]), f"{site} draw {n}"


# --- tracker streams ----------------------------------------------------------------------------


def tracked(model: Model):
    return model.region(
        "r0", lambda h: model.site("s1", model.site("s0", h, "w0", STREAM), "w1", STREAM)
    )


def make_tracker() -> RNGStatesTracker:
    tracker = RNGStatesTracker("cpu")
    tracker.add(STREAM, 2718)
    return tracker


def draw_from(tracker: RNGStatesTracker) -> Callable[[], None]:
    def between() -> None:
        with tracker.fork(STREAM):
            torch.rand(11)

    return between


def test_tracker_stream_is_rewound_for_the_recompute(reentrant):
    tracker = make_tracker()
    result = run(tracked, ckpt_fn(reentrant, tracker), tracker, draw_from(tracker))
    for site in ("s0", "s1"):
        forward, recompute = result.masks[site]
        assert same_bits(recompute, forward), site


def test_tracker_stream_after_backward_equals_reference(reentrant):
    tracker, ref_tracker = make_tracker(), make_tracker()
    got = run(tracked, ckpt_fn(reentrant, tracker), tracker, draw_from(tracker))
    expected = run(tracked, None, ref_tracker, draw_from(ref_tracker))
    assert same_bits(got.tracker_state, expected.tracker_state)
    assert_same_run(got, expected)


# --- errors in the recompute --------------------------------------------------------------------


class RecomputeFailed(Exception):
    pass


def test_failed_recompute_restores_the_rng_state(reentrant):
    torch.manual_seed(SEED)
    calls = []
    weight = torch.rand(SHAPE, requires_grad=True)

    def region(h):
        calls.append(1)
        out = torch.native_dropout(h, 0.5, True)[0]
        if len(calls) == 2:
            raise RecomputeFailed("recompute failed")
        return out * weight

    x = torch.rand(SHAPE, requires_grad=True)
    out = checkpoint(region, x, reentrant=reentrant)
    torch.rand(5)  # the live state now differs from both the snapshot and the post-region state
    before = torch.default_generator.get_state()
    with pytest.raises(RecomputeFailed, match="recompute failed"):
        out.sum().backward()
    assert len(calls) == 2
    assert same_bits(torch.default_generator.get_state(), before)


def test_failed_recompute_restores_the_tracker_stream(reentrant):
    tracker = make_tracker()
    calls = []

    def region(h):
        calls.append(1)
        with tracker.fork(STREAM):
            out = torch.native_dropout(h, 0.5, True)[0]
        if len(calls) == 2:
            raise RecomputeFailed("recompute failed")
        return out * 2

    x = torch.rand(SHAPE, requires_grad=True)
    out = checkpoint(region, x, reentrant=reentrant, tracker=tracker)
    draw_from(tracker)()
    before = tracker.get_states()[STREAM]
    with pytest.raises(RecomputeFailed):
        out.sum().backward()
    assert same_bits(tracker.get_states()[STREAM], before)


# --- memory ---------------------------------------------------------------------------------------


def _live_tensors() -> int:
    gc.collect()
    # type() rather than isinstance(): isinstance asks lazy module attributes (a deprecated torch
    # alias) for their class and warns.
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def test_a_recompute_whose_ops_save_their_outputs_leaves_nothing_alive(reentrant):
    # softmax saves its own output; a recompute that kept that tensor in its pack hook made a
    # cycle through C++ autograd nodes that Python's collector cannot free (attention leaked).
    def region(x):
        return torch.softmax(x, -1) * 2

    def once():
        x = torch.rand(8, 8, requires_grad=True)
        checkpoint(region, x, reentrant=reentrant).sum().backward()

    once()
    before = _live_tensors()
    for _ in range(3):
        once()
    assert _live_tensors() == before
