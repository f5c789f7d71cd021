"""The adapter interface every implementation under test provides (README: "Pointing the harness
at another implementation")."""

from __future__ import annotations

from typing import Any, Callable

from ..checkpoint import RNGStatesTracker
from ..model.cases import Case
from .limits import Limit


class Adapter:
    """A checkpoint function plus its tracker, as the runner sees them.

    Subclasses set `name` and override `checkpoint`; everything else has a default here:
    `description`, `version`, `must_support_all`, `compiled`, `make_tracker`, `supports`, `limit`,
    `declared_limits` and `unavailable`.  The runner reads them with ``getattr`` and these defaults, so an adapter
    written without this base class (a plain object with `name` and `checkpoint`) runs too.
    Adapters never know about pytest.
    """

    name: str = "unnamed"
    description: str = ""
    #: True for impls that must run every valid case of their device (bundled, torch): an
    #: unsupported cell is then a failure, not a declaration.
    must_support_all: bool = False
    #: True for impls that give the runner ``compile(fn)`` and run the whole program under
    #: torch.compile (`harness.run.compiled`, `harness.impls.compiled`) instead of `checkpoint` calls.
    compiled: bool = False

    @property
    def version(self) -> str | None:
        """Version of the code under test, for reports and version-aware expectations."""
        return None

    def make_tracker(self, device: Any) -> Any:
        """A fresh RNG states tracker for `device` (None where the impl has no tracker concept)."""
        return RNGStatesTracker(device)

    def checkpoint(self, fn: Callable[..., Any], *args: Any, reentrant: bool, tracker: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as a checkpointed region and return its output.  Tensors
        may arrive positionally, by keyword, or inside lists and dicts; an adapter whose
        checkpoint cannot take some of these declares those cases in `supports`."""
        raise NotImplementedError

    def supports(self, case: Case) -> str | None:
        """None when the impl can run `case`, else the reason it cannot."""
        return None

    def declared_limits(self) -> "tuple[Limit, ...]":
        """The limits of this impl that are values of one axis each, as data (`harness.impls.limits`):
        the fuzzer draws only what they leave.  An adapter that declares some answers `supports`
        from them too (`limits.declared`), so the two cannot disagree.  None here."""
        return ()

    def limit(self, case: Case) -> str | None:
        """For an impl that must support every case (`must_support_all`): the reason it declares
        `case` a known limit (then `unsupported` is its honest answer, listed in the report), or
        None.  Any other unsupported case of such an impl is a failure."""
        return None

    def unavailable(self) -> str | None:
        """None when the code under test can be loaded here, else one line saying why (e.g. the
        import error of an optional package)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
