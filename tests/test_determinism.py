"""Cases are independent of order, of global RNG state left behind, and of repetition."""

from __future__ import annotations

import random

import torch

from harness.impls import load
from harness.model.matrix import generate
from harness.model.programs import Program
from harness.run.runner import run

IMPLS = ("bundled", "torch", "neg-no-restore", "neg-live-handles")
# The first matrix's programs plus one small program of each new op (the order and isolation
# properties are about the runner, not about what a program draws).
CASES = [c for c in generate(device="cpu", program="flat,nested,siblings")] + [
    c for c in generate(device="cpu", shape="small", passing="positional", layout="mixed", interleave="none")
    if isinstance(c.program, Program) and c.program.nesting.value == "flat" and c.program.dtype.value == "f32"]


def outcomes(order, disturb=False):
    adapters = {name: load(name) for name in IMPLS}
    out = {}
    for impl, case in order:
        if disturb:  # leave the global generators somewhere arbitrary before each case
            torch.manual_seed(random.randrange(2**31))
            torch.rand(17)
        result = run(case, adapters[impl])
        out[(impl, case.id)] = (result.outcome.value, [m.to_dict() for m in result.mismatches])
    return out


WORK = [(impl, case) for impl in IMPLS for case in CASES]


def test_same_results_in_reverse_and_random_order_and_twice():
    forward = outcomes(WORK)
    assert outcomes(list(reversed(WORK))) == forward
    shuffled = list(WORK)
    random.Random(7).shuffle(shuffled)
    assert outcomes(shuffled) == forward
    assert outcomes(WORK) == forward


def test_results_do_not_depend_on_global_rng_state():
    assert outcomes(WORK, disturb=True) == outcomes(WORK)


def test_a_case_leaves_the_global_generators_as_it_found_them():
    torch.manual_seed(99)
    before = torch.get_rng_state()
    for impl in IMPLS:
        run(CASES[-1], load(impl))
    assert torch.equal(torch.get_rng_state(), before)
