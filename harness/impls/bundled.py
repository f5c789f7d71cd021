"""`bundled`: the project's own checkpoint (harness.checkpoint) and its tracker."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .. import __version__
from ..checkpoint import checkpoint
from ..checkpoint.rng import RNGPolicy, ValuePolicy
from ..model import ops
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
        and listed as unsupported in every report; never silently passed).  An ``sdpa_auto``
        site counts as the backend torch picks for it on this machine (`auto_backends`)."""
        if case.capture.value == "eager":
            return None
        auto = auto_backends(case)
        why = f" (sdpa_auto: torch picks {', '.join(sorted(auto))} attention for it here)" if auto else ""
        return self._limit(case, auto, why)

    def _limit(self, case: Any, auto: set[str], why: str) -> str | None:
        # Limits belong to a capture strategy ('auto' resolves by this torch's capabilities).
        strategy = self.policy.strategy()
        if strategy == "philox":
            return None  # redraws from the forward's device seed and offset: no kept outputs to misuse
        reason = self._stash_limit(case, auto, why)
        if reason and strategy != "stash":
            # The controls rewind host values under capture; they are not judged where bundled's
            # own stash is unsound, so their verdicts stay comparable with bundled's.
            return f"not judged for the {strategy!r} capture strategy where the stash is unsound: {reason}"
        return reason

    def _stash_limit(self, case: Any, auto: set[str], why: str) -> str | None:
        efficient = "sdpa_efficient" in {op.value for op in case.program.ops()} or "efficient" in auto
        if efficient and case.capture.value == "separate":
            return ("the stash capture strategy hands memory-efficient attention's forward outputs "
                    "(log-sum-exp, Philox seed and offset) to a separate backward graph, which is not "
                    "sound there (seen on an H200, torch 2.11: 'LSE is not correctly aligned (strideH)' "
                    "and an illegal memory access)" + why)
        if efficient and case.capture.value == "single":
            return ("the stash capture strategy is not sound for memory-efficient attention in one CUDA "
                    "graph either: the fuzzer's smallest case, one region of one f32 efficient-attention "
                    "site, ends in an illegal memory access on an H200 (torch 2.11), where torch's own "
                    "checkpoint passes it (cases/corpus.toml)" + why)
        cudnn = "sdpa_cudnn" in {op.value for op in case.program.ops()} or "cudnn" in auto
        if cudnn and case.capture.value in ("single", "separate") and case.mode.value == "reentrant":
            return ("the stash capture strategy is not sound for cuDNN attention under CUDA-graph capture in "
                    "reentrant mode: on an H200 (torch 2.11) every one of 144 cells of the full matrix's "
                    "reentrant flat cuDNN slice (separate and single capture; default, tracked and untracked "
                    "layouts; positional, keyword and sdpa_kernel passing) gives wrong gradients with the "
                    "masks right, where torch's own checkpoint passes every untracked and default one; the "
                    "non-reentrant cuDNN cells under capture pass" + why)
        return None

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        return checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, policy=self.policy, **kwargs)


def auto_backends(case: Any) -> set[str]:
    """The attention backends torch picks for the ``sdpa_auto`` sites inside the case's regions
    on this machine (`ops.auto_backend`; where this torch cannot be asked, every fused backend
    with a limit here, the cautious answer).  Empty without such sites or off CUDA."""
    # Only sites a region recomputes: outside every region no checkpoint touches them.
    dtypes = {site.dtype for site in case.program.checkpointed_sites() if site.op.value == "sdpa_auto"}
    if not dtypes or case.device.value != "cuda" or not torch.cuda.is_available():
        return set()
    picked = {ops.auto_backend(dtype, case.shape) for dtype in dtypes}
    return {"efficient", "cudnn"} if None in picked else picked  # type: ignore[return-value]


def make_bundled() -> Adapter:
    return BundledAdapter()
