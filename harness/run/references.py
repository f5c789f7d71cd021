"""One reference run per case and tracker kind, however many impls run the case (issue 42).

A case's reference (the program without checkpointing) does not depend on the impl's checkpoint,
only on the case and on the tracker the impl makes (`Adapter.make_tracker`: the streams it
forks, how it saves and restores them).  So when several impls run the same case in one process
(the usual CI job, every controls run), the first makes the reference, checks it
(`check_reference`, and the reproducibility check where the program has an op that may not
reproduce) and the others compare against that same record.  A reference that was not
reproducible is kept as that verdict: every impl of the case is then skipped for the same
reason.  A reference that failed its check is not kept (its error names the impl whose tracker
failed it, and each impl gets its own).

Whose references may be shared (`tracker_kind`): impls that make the harness's own tracker (the
base `Adapter.make_tracker`), impls with no tracker, and adapters that declare ``tracker_kind``,
a string naming what their `make_tracker` makes (equal strings: equal references).  Any other
adapter, one that defines its own `make_tracker` and says nothing, gets references of its own: its
tracker may depend on anything.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..impls.base import Adapter

HARNESS_TRACKER = "harness RNGStatesTracker"
NO_TRACKER = "no tracker"


def tracker_kind(impl: Any) -> str | None:
    """What `impl`'s reference runs depend on besides the case: its declared ``tracker_kind``,
    `HARNESS_TRACKER` where it makes the harness's tracker, `NO_TRACKER` where it has none; None
    where nothing says (its references are its own)."""
    declared = getattr(impl, "tracker_kind", None)
    if declared:
        return str(declared)
    if "make_tracker" in getattr(impl, "__dict__", {}):  # set on the instance: anything
        return None
    made_by = getattr(type(impl), "make_tracker", None)
    if made_by is None:
        return NO_TRACKER
    return HARNESS_TRACKER if made_by is Adapter.make_tracker else None


@dataclass
class Reference:
    """A checked reference run: its record, the names the oracles read (`workload.RunNames`) and
    the case's input tensors it ran on (`workload.Tensors`: later runs take fresh copies), or,
    where a second run differed, why it cannot be judged (`unreproducible`).  No run's session or
    workload is kept: they hold its leaves, gradients and a captured graph's buffers."""

    record: Any = None
    names: Any = None
    tensors: Any = None
    unreproducible: str = ""


class ReferenceCache:
    """The references of the last `size` (case, tracker kind) keys in this process, and counts of
    the references made and reused.  Impls run a case one after another (`pool.by_case`), so a
    few entries are enough, and device memory stays bounded."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: OrderedDict[tuple, Reference] = OrderedDict()

    def get(self, key: tuple | None) -> Reference | None:
        """The reference kept under `key` (None: nothing may be shared, or nothing kept)."""
        if key is None or key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key]

    def put(self, key: tuple | None, reference: Reference) -> None:
        """Keep `reference` under `key` (nothing where `key` is None), dropping the oldest."""
        if key is None:
            return
        self.entries[key] = reference
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()


REFERENCES = ReferenceCache()
