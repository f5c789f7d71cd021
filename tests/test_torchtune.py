"""torchtune's two ways into activation checkpointing (issue 57, item 6): its recipes'
`set_activation_checkpointing` (torch's checkpoint_wrapper with its defaults: the RNG state is
preserved) and the ``ac_mode`` branch that one development config selects (preserve_rng_state=False).
The first checkpoints as torch does; only the second drops the RNG state."""

from __future__ import annotations

import pytest
import torch

from harness import impls
from harness.impls import torchtune as tt
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.verdict import expectations

DRAWS = "nonreentrant-default-eager-flat-none-cpu"  # a region that draws from the default generator
TRACKED = "nonreentrant-tracked-eager-flat-none-cpu"  # a tracker stream torch never saves


def test_the_recipes_path_wraps_the_layer_the_policy_selects_in_torchs_checkpoint_wrapper():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = tt._Layer(lambda h: h * 2)
    apply_activation_checkpointing(model, auto_wrap_policy=ModuleWrapPolicy({tt._Region}))
    assert isinstance(model.layer, CheckpointWrapper)
    x = torch.ones(4, requires_grad=True)
    impls.load("torchtune-recipes").checkpoint(lambda h: h * 2, x, reentrant=False, tracker=None).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0))


@pytest.mark.parametrize("case_id, recipes, ac_mode", [
    (DRAWS, "pass", "mismatch"),  # the recipes preserve the RNG state; ac_mode's branch does not
    (TRACKED, "mismatch", "mismatch"),  # neither saves a tracker stream (torch's own limit)
    ("reentrant-default-eager-flat-none-cpu", "unsupported", "unsupported"),
])
def test_the_recipes_checkpoint_as_torch_does_and_only_ac_mode_drops_the_rng_state(case_id, recipes, ac_mode):
    case = parse_case_id(case_id)
    entries = expectations.load()
    for impl, outcome in (("torchtune-recipes", recipes), ("torchtune-ac", ac_mode)):
        result = runner.run(case, impls.load(impl))
        assert result.outcome.value == outcome, (impl, result.error, [m.oracle for m in result.mismatches])
        if outcome == "mismatch":  # a known bug: torch's (the tracker) or the ac_mode branch's (the RNG state)
            entry = expectations.find(entries, impl, case)
            assert entry is not None and entry.explains(outcome, [m.oracle for m in result.mismatches], result.error)
    wrapper = runner.run(case, impls.load("torch-checkpoint-wrapper"))
    if recipes != "unsupported":  # the recipes' path is torch's checkpoint_wrapper, case for case
        assert wrapper.outcome.value == recipes
    assert impls.load("torchtune-recipes").version.startswith(("config:torchtune-", "0."))


@pytest.mark.parametrize("torch_version", ["2.11.0", "2.14.1"])
def test_the_host_rewind_entry_claims_the_recipes_by_the_torch_version_not_their_own(torch_version):
    # torchtune-recipes' version is torchtune's ("config:torchtune-0.6.1" without it), not torch's:
    # an entry that ranged over `versions` never matched it, and the H100 (torch 2.11) judged its
    # seven separate-graph cells unexpected failures.  The bug is torch's, so the range is `torch`.
    from machines import h200_torch_2_11

    case = parse_case_id("nonreentrant-default-separate-flat-draws-cuda")
    entries = expectations.load()
    for impl, version in (("torch-checkpoint-wrapper", torch_version), ("torchtune-recipes", "config:torchtune-0.6.1"),
                          ("torchtune-recipes", "0.6.1")):
        entry = expectations.find(entries, impl, case, version=version, torch_version=torch_version,
                                  machine=h200_torch_2_11())
        assert entry is not None and entry.name == "host-rewind-separate-graphs", (impl, version)
