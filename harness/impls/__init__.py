"""Finding implementations under test by name.

A name is one of the shipped impls (`BUILTIN`, the one list of them), one a third-party package
registers in the entry-point group ``harness.implementations``, or an import path
``package.module:factory``.  A factory returns an `Adapter`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .. import entry_points
from ..errors import UsageError
from .base import Adapter

ENTRY_POINT_GROUP = entry_points.IMPLS_GROUP

BUILTIN: dict[str, str] = {
    "bundled": "harness.impls.bundled:make_bundled",
    "torch": "harness.impls.torch_checkpoint:make_torch",
    "neg-live-handles": "harness.impls.negative:make_live_handles",
    "neg-no-restore": "harness.impls.negative:make_no_restore",
    "neg-ignore-tracker": "harness.impls.negative:make_ignore_tracker",
    "neg-no-rewind": "harness.impls.negative:make_no_rewind",
    "neg-host-values": "harness.impls.negative:make_host_values",
    "neg-no-recompute": "harness.impls.negative:make_no_recompute",
    "neg-stale-rng": "harness.impls.negative:make_stale_rng",
    "neg-extra-draw": "harness.impls.negative:make_extra_draw",
    "neg-wrong-output": "harness.impls.negative:make_wrong_output",
    "neg-replace-streams": "harness.impls.negative:make_replace_streams",
    "neg-inert-fork": "harness.impls.negative:make_inert_fork",
    "neg-copied-alias": "harness.impls.negative:make_copied_alias",
    "neg-two-slots": "harness.impls.negative:make_two_slots",
    "neg-leak-sdpa": "harness.impls.negative:make_leak_sdpa",
    "neg-leak-deterministic": "harness.impls.negative:make_leak_deterministic",
    "neg-leak-default-dtype": "harness.impls.negative:make_leak_default_dtype",
    "neg-leak-autocast": "harness.impls.negative:make_leak_autocast",
    "neg-leak-stream": "harness.impls.negative:make_leak_stream",
    "neg-id-pool": "harness.impls.negative:make_id_pool",
    "neg-stale-third-step": "harness.impls.negative:make_stale_third_step",
    "neg-rank0-snapshot": "harness.impls.negative:make_rank0_snapshot",
    "neg-rank-reseed": "harness.impls.negative:make_rank_reseed",
    "neg-rank-cp-blind": "harness.impls.negative:make_rank_cp_blind",
    "neg-remat-entry-only": "harness.impls.negative:make_remat_entry_only",
    "neg-remat-save-no-tracker": "harness.impls.negative:make_remat_save_no_tracker",
    # External implementations: they load whether or not the package is installed, and declare
    # every case unsupported (with the import error) when it does not import.
    "megatron": "harness.impls.megatron:make_megatron",
    "megatron-graphsafe": "harness.impls.megatron:make_megatron_graphsafe",
    "megatron-distribute": "harness.impls.megatron:make_megatron_distribute",
    "transformer-engine": "harness.impls.transformer_engine:make_transformer_engine",
    "deepspeed": "harness.impls.deepspeed:make_deepspeed",
    "deepspeed-partition": "harness.impls.deepspeed:make_deepspeed_partition",
    # torch's other checkpointing paths: selective (SAC) and compiled (the program under torch.compile).
    "torch-sac-recompute": "harness.impls.selective:make_sac_recompute",
    "torch-sac-save-rng": "harness.impls.selective:make_sac_save_rng",
    "torch-sac-titan": "harness.impls.selective:make_sac_titan",
    "torch-sac-save-first-rng": "harness.impls.selective:make_sac_save_first_rng",
    # torch's checkpoint reached the other ways users reach it.
    "torch-checkpoint-wrapper": "harness.impls.torch_checkpoint:make_checkpoint_wrapper",
    "torch-decorator": "harness.impls.torch_checkpoint:make_decorator",
    "torch-partial": "harness.impls.torch_checkpoint:make_partial",
    "torch-composable": "harness.impls.torch_checkpoint:make_composable",
    "torch-compile": "harness.impls.compiled:make_compiled",
    "torch-compile-budget": "harness.impls.compiled:make_budget",
    # torch's prototype regional budget (issue 39): aot_eager's min-cut partition and inductor, b = 0.5 and 0.0.
    "torch-region-budget": "harness.impls.compiled:make_region_budget",
    "torch-region-budget-0": "harness.impls.compiled:make_region_budget_0",
    "torch-region-budget-inductor": "harness.impls.compiled:make_region_budget_inductor",
    "torch-region-budget-inductor-0": "harness.impls.compiled:make_region_budget_inductor_0",
    # What frameworks choose for their users (issue 39): accelerate's FSDP2 activation checkpointing.
    "accelerate-fsdp2": "harness.impls.accelerate:make_fsdp2",
    "accelerate-fsdp2-offload": "harness.impls.accelerate:make_fsdp2_offload",
    "torchtune-ac": "harness.impls.torchtune:make_torchtune",
    "torchtune-recipes": "harness.impls.torchtune:make_torchtune_recipes",
    # torch_remat (issue 38): no hook, its README's hook, the harness's hook.
    "remat": "harness.impls.remat:make_remat",
    "remat-readme-hook": "harness.impls.remat:make_readme_hook",
    "remat-hook": "harness.impls.remat:make_hook",
}
NEGATIVE_CONTROLS = tuple(name for name in BUILTIN if name.startswith("neg-"))


class ImplError(UsageError):
    """An implementation that cannot be found or built; the message is one line for the user."""


def registered() -> dict[str, str]:
    """Name -> 'module:factory' for every known implementation: the shipped ones (`BUILTIN`) and
    those of installed packages' entry points (which may override a shipped name)."""
    names = dict(BUILTIN)
    for name, registration in entry_points.impls().items():
        names[name] = registration.value
    return names


def package_of(adapter: Any) -> "entry_points.Registration | None":
    """The installed package that registered `adapter`'s impl (set by `load`), None for a shipped
    impl or one given as module:factory."""
    return getattr(adapter, "_harness_registration", None)


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, whitespace collapsed to single spaces."""
    try:
        message = " ".join(str(exc).split())
    except Exception:  # a broken __str__ must not hide the exception's type
        message = ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _short_repr(obj: object, limit: int = 80) -> str:
    """repr(obj) on one line, at most `limit` characters (an ellipsis marks a cut)."""
    try:
        text = " ".join(repr(obj).split())
    except Exception as exc:
        return f"<repr failed: {one_line(exc)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_factory(name: str, path: str) -> Callable[[], Adapter]:
    """The factory function `path` ('module:factory') names, for implementation `name`.

    Anything that goes wrong (a bad path, a module that raises at import, including SystemExit,
    a missing or non-callable attribute) is an `ImplError` with a one-line message.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ImplError(f"bad implementation path {path!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a broken module may raise anything, or exit
        raise ImplError(f"cannot import {module_name!r} for implementation {name!r}: "
                        f"{one_line(exc)}") from None
    try:
        factory = getattr(module, attr, None)
    except Exception as exc:  # a module-level __getattr__ that raises
        raise ImplError(f"cannot read {path} for implementation {name!r}: "
                        f"{one_line(exc)}") from None
    if factory is None:
        raise ImplError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise ImplError(f"{path} is a {type(factory).__name__}, not a factory function")
    return factory


def _is_adapter(obj: object) -> bool:
    """An `Adapter`, or anything with a callable `checkpoint` (adapters need not subclass it)."""
    if isinstance(obj, Adapter):
        return True
    try:
        return callable(getattr(obj, "checkpoint", None))
    except Exception:
        return False


def _build(name: str, path: str, factory: Callable[[], Adapter]) -> Adapter:
    """The adapter `factory` returns; `ImplError` when it raises, exits or returns no adapter."""
    try:
        adapter = factory()
    except (Exception, SystemExit) as exc:  # a broken third-party factory is bad input, not a crash
        raise ImplError(f"factory {path} for implementation {name!r} raised "
                        f"{one_line(exc)}") from None
    if not _is_adapter(adapter):
        raise ImplError(f"factory {path} for implementation {name!r} did not return an adapter: "
                        f"got {type(adapter).__name__} {_short_repr(adapter)}")
    return adapter


def load(name: str) -> Adapter:
    """The adapter for a registered name or a ``module:factory`` path.

    Every fault (an unknown name, a module or factory that raises, a factory that returns no
    adapter) is an `ImplError` with a one-line message, never a traceback.
    """
    known = registered()
    if name in known:
        path = known[name]
    elif ":" in name:
        path = name
    else:
        raise ImplError(f"unknown implementation {name!r}; known: {', '.join(sorted(known))} "
                        "(or give package.module:factory)")
    adapter = _build(name, path, _import_factory(name, path))
    if not getattr(adapter, "name", None) or getattr(adapter, "name") == "unnamed":
        adapter.name = name
    # a name a package registers (not a shipped one as shipped): asked once more, only for such names
    registration = entry_points.impls().get(name) if path != BUILTIN.get(name) else None
    if registration is not None and registration.value == path:
        # the package behind the name: its version stands in where the adapter names none
        adapter._harness_registration = registration
    return adapter


def parse_impl_names(values: list[str] | str | None, default: str = "bundled") -> list[str]:
    """Flatten repeatable / comma-separated impl options into a de-duplicated list of names (`default`
    when none is given); a value that names nothing (``--impl ''``) raises ImplError."""
    if not values:
        return [default]
    if isinstance(values, str):
        values = [values]
    names: list[str] = []
    for value in values:
        if not value.replace(",", "").strip():  # `--impl ''`: a name left out, not a request for the default
            raise ImplError(f"--impl {value!r} names no implementation; the names: python -m harness list --impls")
        for name in value.split(","):
            name = name.strip()
            if name == "all":
                names.extend(n for n in BUILTIN if n not in names)
            elif name and name not in names:
                names.append(name)
    return names or [default]
