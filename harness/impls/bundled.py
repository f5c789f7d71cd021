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

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any) -> Any:
        return checkpoint(fn, *args, reentrant=reentrant, tracker=tracker, policy=self.policy)


def make_bundled() -> Adapter:
    return BundledAdapter()
