"""The public home of what a ``harness module`` factory returns: ``from harness.module_mode import
ModelCase`` (the path factories have always used; module mode itself is `harness.fronts.module_mode`)."""

from harness.fronts.module_mode import ModelCase

__all__ = ["ModelCase"]
