"""What a run reads besides code, shipped inside the package: one place that finds it.

The files here travel in the wheel and the sdist (pyproject's package data) and are found through
`importlib.resources`, so an installed harness and a checkout read the same bytes:

- ``expectations.toml``: the shipped expectation entries (the known bugs of the shipped impls);
- ``corpus.toml``: the fuzzer's findings, which the default matrix replays;
- ``machines/*.json``: what a torch build did on a machine the records came from (for the audit
  and `expectations diff` on another machine).

In a checkout, ``cases/expectations.toml``, ``cases/corpus.toml`` and ``cases/machines`` are links
to these files: contributors edit them in either place.  This module imports nothing heavy (no
torch): the pytest entry point and the report readers may use it.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

EXPECTATIONS = "expectations.toml"
CORPUS = "corpus.toml"
MACHINES = "machines"


def shipped(name: str) -> Traversable:
    """The shipped data file (or folder) `name` ('expectations.toml', 'machines/x.json')."""
    return resources.files(__name__).joinpath(*name.split("/"))


def path(name: str) -> Path:
    """`name`'s location on the file system.  Every way pip installs a package (a wheel, an
    editable checkout) leaves it a real file; a harness imported from a zip archive has none,
    and its readers say so in one line rather than reading another file."""
    found = shipped(name)
    if not isinstance(found, Path):
        raise OSError(f"the shipped {name} is not a file on disk ({found}): "
                      "install the harness unpacked (pip install), not as a zip")
    return found


def machine_names() -> list[str]:
    """The shipped machine-fact files' names without '.json' ('h200-torch2.11')."""
    return sorted(entry.name[: -len(".json")] for entry in shipped(MACHINES).iterdir()
                  if entry.name.endswith(".json"))


def machine_file(name: str) -> "Path | None":
    """The shipped machine-fact file called `name` (with or without '.json'), None if none is."""
    stem = name[: -len(".json")] if name.endswith(".json") else name
    if "/" in stem or stem not in machine_names():
        return None
    return path(f"{MACHINES}/{stem}.json")


def in_checkout() -> bool:
    """True when the package runs from a source checkout (the repository's pyproject.toml lies
    beside it): there, the shipped files are the contributors' own and `fuzz --save` may add to
    the corpus; in an installed package they are read-only site-packages."""
    package_root = Path(__file__).resolve().parents[1]
    return (package_root.parent / "pyproject.toml").is_file() and (package_root.parent / "cases").is_dir()
