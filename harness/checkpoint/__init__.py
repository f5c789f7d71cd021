"""The project's own checkpoint implementation and its RNG states tracker."""

from .core import checkpoint
from .remat_hook import RecomputeRNGHook
from .rng import RNGPolicy, StateValues, ValuePolicy, live_generators
from .tracker import RNGStatesTracker, TrackerError

__all__ = [
    "checkpoint",
    "RecomputeRNGHook",
    "RNGPolicy",
    "StateValues",
    "ValuePolicy",
    "live_generators",
    "RNGStatesTracker",
    "TrackerError",
]
