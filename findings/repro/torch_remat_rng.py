"""torch_remat 0.2.2 and random numbers: what its defaults and its README's hook do, and a hook
error that poisons every later checkpoint.

1. No RecomputeStateHook (the default; preserve_rng_state=True is refused): the recompute redraws
   every dropout mask from the advanced generator, so the gradients are wrong and the generator
   ends ahead of a plain run.
2. The README's CudaRNGStateHook calls torch.cuda.get_rng_state(hidden_states.device): a block on
   the CPU raises at region entry, and the CPU generator is never saved.
3. When a hook's snapshot() raises at region entry (2, say), torch_remat leaves its region context
   variable set: every later torch_remat.checkpoint in that thread raises "nested
   torch_remat.checkpoint regions are not supported", though nothing is nested.
4. A hook that snapshots and restores every live generator by value makes the replay bit for bit
   (the harness ships one: from harness.checkpoint import RecomputeRNGHook; here inline).
   Shown before 2 and 3: after 3, no checkpoint runs in this process.

    python torch_remat_rng.py

Needs torch and torch-remat only.  Exit 1 while 1 or 3 shows (2 is the README's example as
written: a CUDA-only hook, reported beside them).
"""
import sys

import torch
import torch_remat as remat


def block(h):
    return h * (torch.rand_like(h) > 0.5) * 2.0


def train_step(hooks=None):
    """Three dropout blocks, checkpointed with torch_remat (hooks) or not (None)."""
    torch.manual_seed(0)
    x = torch.ones(16384, requires_grad=True)
    h = x
    for n in range(3):
        h = block(h) if hooks is None else remat.checkpoint(region_name=f"l{n}", recompute_state_hooks=hooks)(block)(h)
    h.sum().backward()
    return x.grad, torch.get_rng_state()


class CudaRNGStateHook:  # torch_remat's README, as written
    def __init__(self, device):
        self.device = device

    def snapshot(self):
        return torch.cuda.get_rng_state(self.device)

    def restore(self, state):
        torch.cuda.set_rng_state(state, self.device)


class AllGeneratorsHook:  # what harness.checkpoint.RecomputeRNGHook does, for the CPU generator
    def snapshot(self):
        return torch.get_rng_state()

    def restore(self, state):
        torch.set_rng_state(state)


reference, state = train_step()
bugs = 0

grad, after = train_step(hooks=())
wrong = int((grad != reference).sum())
print(f"1. no hook:         {wrong} of {grad.numel()} input-gradient elements differ; "
      f"generator ends {'ahead of' if not torch.equal(after, state) else 'where'} a plain run")
bugs += wrong > 0

grad, after = train_step(hooks=(AllGeneratorsHook(),))
wrong = int((grad != reference).sum())
print(f"4. value hook:      {wrong} elements differ; generator ends "
      f"{'where' if torch.equal(after, state) else 'elsewhere than'} a plain run")
try:
    train_step(hooks=(CudaRNGStateHook(torch.device("cpu")),))
    print("2. README hook:     ran on a CPU block")
except Exception as exc:
    print(f"2. README hook:     a CPU block raises at region entry: {type(exc).__name__}: {exc}")
    try:
        remat.checkpoint(region_name="after")(block)(torch.ones(4, requires_grad=True))
        print("3. next checkpoint: runs")
    except NotImplementedError as poisoned:
        print(f"3. next checkpoint: {type(poisoned).__name__}: {poisoned} (nothing is nested)")
        bugs += 1

sys.exit(1 if bugs else 0)
