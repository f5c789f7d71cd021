"""The public home of what a ``harness module`` factory returns: ``from harness.module_mode import
ModelCase`` (the path factories have always used; module mode's run is `harness.run.module_run`,
its command `harness.fronts.module_mode`)."""

from harness.run.module_run import ModelCase

__all__ = ["ModelCase"]
