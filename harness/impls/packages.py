"""The base of every adapter over an optional package (Megatron-core, TransformerEngine,
DeepSpeed): the package imported lazily (`LazyModule`, so ``--impl`` always loads and a missing
package is one line), its version (`installed_version`, `module_version`), the adapter base
(`PackageAdapter`) and the view of a package's own tracker the harness drives (`TrackerView`)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from .base import Adapter


class LazyModule:
    """A module imported on first use; the import error, if any, is kept as a one-line string.

    Adapters must load (and list their cases) whether or not the package is installed, so nothing
    is imported at factory time.  Any exception counts as "does not import": a broken install can
    raise OSError or a RuntimeError as easily as ImportError.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._module: Any = None
        self._error: str | None = None
        self._tried = False

    def load(self) -> Any:
        """The module, or None when it does not import (see `error`)."""
        if not self._tried:
            self._tried = True
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # import-time chatter about optional extras
                    self._module = importlib.import_module(self.name)
            except (Exception, SystemExit) as exc:  # a broken package may exit, not just fail
                message = " ".join(str(exc).split())  # one line, for reports and pytest skips
                self._error = f"{type(exc).__name__}: {message}".strip()
        return self._module

    @property
    def error(self) -> str | None:
        self.load()
        return self._error

    @property
    def tried(self) -> bool:
        """Whether the import was made (by `load`), so asking about it imports nothing."""
        return self._tried

    def require(self) -> Any:
        """The module; raises ImportError with the kept message when it does not import."""
        module = self.load()
        if module is None:
            raise ImportError(f"{self.name} does not import: {self._error}")
        return module

    def forget(self) -> None:
        """Drop the cached result, so the next use imports again (tests swap stand-ins)."""
        self._module, self._error, self._tried = None, None, False


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, or None."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # a malformed dist-info is no reason to crash a report
            continue
    return None


def shadowed(module: Any, distributions: Iterable[str]) -> bool:
    """Whether `module` (an imported module, or the name of a top-level one: then the copy an
    import would load, found without importing it) lies outside the folder of the first installed
    distribution among `distributions` (whose metadata would then name another copy's version)."""
    path = _location(module)
    for dist in distributions:
        try:
            root = Path(str(importlib.metadata.distribution(dist).locate_file(""))).resolve()
        except Exception:  # not installed, or a malformed dist-info: nothing to compare with
            continue
        return path is not None and root not in Path(path).resolve().parents
    return False


def _location(module: Any) -> "str | None":
    """The file (or, for a namespace package, the first folder) `module` is or would be loaded
    from: an imported module's own, else what the import system finds for that name."""
    if isinstance(module, str):
        module = sys.modules.get(module) or _spec(module)
    if module is None:
        return None
    found = getattr(module, "__file__", None) or getattr(module, "origin", None)
    if found in (None, "namespace"):
        locations = list(getattr(module, "__path__", None) or getattr(module, "submodule_search_locations", None)
                         or [])
        found = locations[0] if locations else None
    return found


def _spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def graphsafe_apis_missing() -> list[str]:
    """The torch APIs a graph-safe tracker needs that this torch build lacks."""
    wanted = [
        (getattr(torch.cuda, "CUDAGraph", None), "register_generator_state", "CUDAGraph"),
        (torch.Generator, "graphsafe_set_state", "Generator"),
        (torch.Generator, "graphsafe_get_state", "Generator"),
        (torch.Generator, "clone_state", "Generator"),
    ]
    return [f"{owner}.{attr}" for obj, attr, owner in wanted if obj is None or not hasattr(obj, attr)]


def no_aliases_reason(tracker: str) -> str:
    """Why an adapter over a tracker without aliases declares the shared layout unsupported."""
    return (f"{tracker} has no aliases: the shared layout would test only the harness's own alias "
            "bookkeeping, not the package")


def _value(state: Any) -> torch.Tensor:
    """A value copy of a tracker state: a Generator's state, or a clone of a state tensor."""
    if isinstance(state, torch.Generator):
        return state.get_state()
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    raise TypeError(f"tracker state of unexpected type {type(state).__name__}")


class TrackerView:
    """The harness's handle on an upstream RNG tracker (Megatron-core's or TransformerEngine's).

    `real` is the upstream tracker object itself; the checkpoint under test works on it directly.
    The view adds what the harness needs and upstream trackers lack (it has no aliases, as upstream
    has none: adapters over it declare the shared layout unsupported):

    * `names()`: the upstream stream names, in upstream order;
    * `get_states()`: name -> value copy, whatever upstream stores (value ByteTensors in plain
      mode, live `torch.Generator` objects in graph-safe mode);
    * `set_states(values)`: writes values in place, into the existing Generator objects in
      graph-safe mode (so CUDA graphs that registered them still see them) or as fresh tensors in
      plain mode, then hands the dict back through upstream's own ``set_states``;
    * `generators()` / `generator(name)`: the distinct Generator objects (for graph registration)
      and the object behind a name (graph-safe mode only, see `generator`).
    """

    def __init__(self, real: Any, device: "torch.device | str | None" = None) -> None:
        self.real = real
        self.device = torch.device(device) if device is not None else None

    def _upstream(self) -> dict[str, Any]:
        return dict(self.real.get_states())

    def add(self, name: str, seed: int) -> None:
        """Add stream `name` to the upstream tracker, seeded with `seed`."""
        self.real.add(name, seed)

    def names(self) -> list[str]:
        """The upstream stream names, in upstream order."""
        return list(self._upstream())

    def fork(self, name: str) -> contextlib.AbstractContextManager:
        """Upstream's own ``fork(name)``: draws inside it come from stream `name`."""
        return self.real.fork(name)

    def get_states(self) -> dict[str, torch.Tensor]:
        """Name -> a value copy of each upstream stream (never a live object)."""
        return {name: _value(state) for name, state in self._upstream().items()}

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Write `states` (values or Generators) upstream: into Generators in place, else as copies."""
        current = self._upstream()
        for name, value in states.items():
            if name not in current:
                raise KeyError(f"unknown RNG stream {name!r}")
            value = _value(value)
            if isinstance(current[name], torch.Generator):
                current[name].set_state(value)
            else:
                current[name] = value
        self.real.set_states(current)

    @property
    def generator(self) -> Callable[[str], torch.Generator]:
        """``generator(name)``: the upstream Generator object behind `name`, for the stream
        inventory.  Only where upstream keeps Generator objects (graph-safe mode): in plain mode
        it keeps value tensors that every fork replaces, so no object's identity means anything and
        the attribute is missing (``hasattr(view, "generator")`` is False)."""
        if not self.generators():
            raise AttributeError("generator: the upstream tracker keeps values, not Generator objects")
        return self._generator

    def _generator(self, name: str) -> torch.Generator:
        return self._upstream()[name]

    def generators(self) -> list[torch.Generator]:
        """The distinct upstream Generator objects (none in plain mode), for graph registration."""
        out: list[torch.Generator] = []
        for state in self._upstream().values():
            if isinstance(state, torch.Generator) and all(state is not g for g in out):
                out.append(state)
        return out

    def __repr__(self) -> str:
        return f"<TrackerView of {type(self.real).__module__}.{type(self.real).__qualname__}: {self.names()}>"


def module_version(module: Any, attrs: Iterable[str]) -> str | None:
    """The first string among dotted attribute paths of `module` (e.g. 'package_info.__version__')."""
    for path in attrs:
        obj = module
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, str) and obj:
            return obj
    return None


class PackageAdapter(Adapter):
    """An adapter over an optional package, imported lazily (Megatron-core, TransformerEngine,
    DeepSpeed): `module()`, `import_error`, `version` and `unavailable()` from the subclass's
    `LazyModule` and the package's distributions."""

    package = ""  # how messages name the package
    distributions: tuple[str, ...] = ()  # installed distributions to read the version from, in order
    top_module = ""  # for a source checkout (no dist-info): the module whose attributes hold the version
    version_attrs: tuple[str, ...] = ("__version__",)

    @staticmethod
    def lazy() -> LazyModule:
        """The module under test (a module-level `LazyModule`, looked up at call time so tests can
        swap it)."""
        raise NotImplementedError

    @classmethod
    def module(cls) -> Any:
        """The module under test; ImportError (with the reason) if it does not import."""
        return cls.lazy().require()

    @property
    def import_error(self) -> str | None:
        return self.lazy().error

    @property
    def version(self) -> str | None:
        """The version of the code under test: the installed metadata, read without importing
        the package (a process that only writes reports never pays for the import), unless the
        module imported is another copy than the one the metadata describes (a checkout or a
        stand-in on PYTHONPATH shadowing an installed release): then the module's own version
        attribute, as for a checkout with no metadata.  None where the import was made and failed:
        nothing of the package ran."""
        lazy = self.lazy()
        if lazy.tried and lazy.load() is None:
            return None
        found = installed_version(*self.distributions)
        if found is not None and not shadowed(self.top_module, self.distributions):
            return found
        if lazy.load() is None:
            return found
        return module_version(sys.modules.get(self.top_module), self.version_attrs) or found

    def unavailable(self) -> str | None:
        """None when the module under test imports, else one line with its import error."""
        error = self.import_error
        return None if error is None else f"{self.package} does not import ({self.lazy().name}): {error}"
