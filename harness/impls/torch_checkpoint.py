"""`torch`: `torch.utils.checkpoint.checkpoint` with the bundled tracker.

It saves the CPU generator and the default generators of its tensor arguments' devices, by value;
tracker streams are separate generator objects it never sees, so tracked layouts are expected to
fail (a true finding, recorded in cases/expectations.toml).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from .base import Adapter


class TorchAdapter(Adapter):
    name = "torch"
    must_support_all = True  # every valid case of its device: unsupported would be a failure
    description = "torch.utils.checkpoint.checkpoint(preserve_rng_state=True)"

    @property
    def version(self) -> str | None:
        return torch.__version__

    def options(self) -> dict[str, Any]:
        """Further keywords for ``torch.utils.checkpoint.checkpoint`` (selective checkpointing
        passes its ``context_fn`` here)."""
        return {}

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            if not torch.is_grad_enabled():
                # A nested reentrant region runs inside its parent's no-grad forward, where torch
                # warns that no input requires grad; the parent's recompute runs it again with grad.
                # With grad enabled the warning is real (it explains the error that follows): shown.
                warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
            return torch.utils.checkpoint.checkpoint(
                fn, *args, use_reentrant=reentrant, preserve_rng_state=True, **self.options(), **kwargs
            )


def make_torch() -> Adapter:
    return TorchAdapter()
