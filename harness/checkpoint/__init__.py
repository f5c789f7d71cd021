"""The project's own checkpoint implementation and its RNG states tracker."""

from .core import checkpoint
from .rng import RNGPolicy, StateValues, ValuePolicy, live_generators
from .tracker import RNGStatesTracker, TrackerError

__all__ = [
    "checkpoint",
    "RNGPolicy",
    "StateValues",
    "ValuePolicy",
    "live_generators",
    "RNGStatesTracker",
    "TrackerError",
]
