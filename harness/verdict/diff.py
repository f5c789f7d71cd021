"""Two expectations files side by side: which cells of the default matrices they claim
differently (`python -m harness expectations diff`), so that an edit that should change nothing
(a predicate rewritten as a model, say) is shown to change nothing, or each change is listed.

Nothing runs: every impl's expected failure for every case is looked up in both files, under the
same machine facts (`models.Machine`: a JSON file of what the installed torch does, such as
``h200-torch2.11``, shipped in `harness.data`; without one, this machine's torch is asked, and CUDA
cells on a machine without CUDA get no answer)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import data as shipped_data
from ..errors import UsageError
from .expectations import Expectation, find
from .models import Machine


@dataclass
class ClaimDiff:
    """Cells claimed differently, grouped by (impl, device, old expectation, new expectation)."""

    cells: int = 0
    groups: Counter = field(default_factory=Counter)
    examples: dict[tuple, str] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(self.groups.values())


def expected(entry: "Expectation | None") -> str:
    """What an entry (as `find` returns it) expects, 'nothing' for none or a pass entry."""
    return "nothing" if entry is None or entry.expects_pass else entry.expected()


def load_machine(path: "str | None") -> Machine:
    """The machine facts of a JSON file (``{"facts": {...}}``) or of a shipped one named without
    its folder ('h200-torch2.11', `harness.data.machine_names`), else this machine's torch; a file
    that cannot be read is one line (UsageError)."""
    if not path:
        return Machine()
    if not Path(path).exists() and shipped_data.machine_file(path) is not None:
        path = str(shipped_data.machine_file(path))
    try:
        data = json.loads(Path(path).read_text())
        facts = data["facts"]
        if not isinstance(facts, dict):
            raise TypeError("facts is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read machine facts {path}: {exc}") from None
    return Machine(facts, probe=False)


def claim_diff(old: Sequence[Expectation], new: Sequence[Expectation], impls: Iterable[str],
               cases: Iterable[Any], machine: Machine, torch_version: "str | None" = None) -> ClaimDiff:
    """Every (impl, case) pair looked up in both files: the cells whose expected failure differs."""
    found = ClaimDiff()
    names = list(impls)
    for case in cases:
        for impl in names:
            found.cells += 1
            before = expected(find(old, impl, case, torch_version=torch_version, machine=machine))
            after = expected(find(new, impl, case, torch_version=torch_version, machine=machine))
            if before != after:
                key = (impl, case.device.value, before, after)
                found.groups[key] += 1
                found.examples.setdefault(key, case.id)
    return found
