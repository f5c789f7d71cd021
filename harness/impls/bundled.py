"""`bundled`: the project's own checkpoint (harness.checkpoint) and its tracker."""

from __future__ import annotations

from typing import Any, Callable

from .. import __version__
from ..checkpoint import checkpoint
from ..checkpoint.rng import RNGPolicy, ValuePolicy
from .base import Adapter


class BundledAdapter(Adapter):
    """The bundled checkpoint, parameterised by its RNG policy (negative controls swap it)."""

    name = "bundled"
    must_support_all = True  # every valid case of its device: unsupported would be a failure
    description = "harness.checkpoint: value snapshots of every live stream, rewound in place"
    policy: RNGPolicy = ValuePolicy()

    @property
    def version(self) -> str | None:
        return __version__

    def supports(self, case: Any) -> str | None:
        return self.limit(case)

    def limit(self, case: Any) -> str | None:
        """The cases the bundled checkpoint is known not to handle, with why (declared, counted
        and listed as unsupported in every report; never silently passed)."""
        efficient = "sdpa_efficient" in {op.value for op in case.program.ops()}
        if efficient and case.capture.value == "separate":
            return ("the stash capture strategy hands memory-efficient attention's forward outputs "
                    "(log-sum-exp, Philox seed and offset) to a separate backward graph, which is not "
                    "sound there (seen on an H200, torch 2.11: 'LSE is not correctly aligned (strideH)' "
                    "and an illegal memory access)")
        if efficient and case.capture.value == "single":
            return ("the stash capture strategy is not sound for memory-efficient attention in one CUDA "
                    "graph either: the fuzzer's smallest case, one region of one f32 efficient-attention "
                    "site, ends in an illegal memory access on an H200 (torch 2.11), where torch's own "
                    "checkpoint passes it (cases/corpus.toml)")
        cudnn = "sdpa_cudnn" in {op.value for op in case.program.ops()}
        if cudnn and case.capture.value in ("single", "separate") and case.mode.value == "reentrant":
            return ("the stash capture strategy is not sound for cuDNN attention under CUDA-graph capture in "
                    "reentrant mode: on an H200 (torch 2.11) every one of 144 cells of the full matrix's "
                    "reentrant flat cuDNN slice (separate and single capture; default, tracked and untracked "
                    "layouts; positional, keyword and sdpa_kernel passing) gives wrong gradients with the "
                    "masks right, where torch's own checkpoint passes every untracked and default one; the "
                    "non-reentrant cuDNN cells under capture pass")
        return None

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, policy=self.policy, **kwargs)


def make_bundled() -> Adapter:
    return BundledAdapter()
