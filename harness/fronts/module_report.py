"""Module mode's results as text and as records: what `harness module` prints, the record each
run adds to results.jsonl (the shape the matrix writes, so `harness report`, `merge` and
`compare` read it), and the script that repeats a run.

A module run's record is a case record: ``impl``, ``case_id``, the axes (``mode``, ``capture``,
``device``; ``layout`` is ``module``, ``program`` the factory and its --wrap patterns,
``interleave`` ``none``; the program factors empty), ``outcome``, ``reason``, ``error``,
``mismatches``, ``verdict``; and what only a module run has: ``kind`` (``module``), ``factory``,
``wrap``, ``checkpointed`` (the submodule paths), ``draws_per_forward``, ``draw_sites``,
``first_divergent_draw``, ``diagnosis``, ``transformers`` (the version a transformers model comes
from, else empty) and ``checkpointing_api`` (the method that turned the model's own checkpointing
on: ``activation_checkpointing_enable``, ``gradient_checkpointing_enable`` before transformers 5.23,
or ``_set_gradient_checkpointing``; empty where none did).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Sequence

from ..model.cases import AXES, Capture, Mode
from ..results import AS_BUILT, CaseRecord, Outcome, Verdict
from ..verdict.expectations import judge

if TYPE_CHECKING:
    from ..run.module_run import ModuleResult

SHOWN_PATHS = 8  # checkpointed paths a summary names before it counts the rest
MODULE_LAYOUT = "module"  # the layout column of a module run's record: its own row in the matrices


def program_name(factory: str, wrap: Sequence[str] | None) -> str:
    """``examples.mlp:factory`` or ``model:gpt2[transformer.h.*]``: the factory and its --wrap patterns."""
    patterns = [p for p in (wrap or []) if p]
    return f"{factory}[{','.join(patterns)}]" if patterns else factory


def mode_name(impl: str, mode: Mode) -> str:
    """The mode column: the checkpoint mode asked for, or ``as-built`` (the library chose its own)."""
    return AS_BUILT if impl == AS_BUILT else mode.value


def case_id(factory: str, impl: str, device: str, capture: Capture, mode: Mode, wrap: Sequence[str] | None) -> str:
    """``nonreentrant-module-eager-examples.mlp:factory-none-cpu``: the matrix's id order."""
    return "-".join([mode_name(impl, mode), MODULE_LAYOUT, capture.value, program_name(factory, wrap), "none", device])


def record(result: "ModuleResult", factory: str, impl: str, version: str | None, device: str, capture: Capture,
           mode: Mode, wrap: Sequence[str] | None, must_support: bool = False,
           rounding_fails: bool = False) -> CaseRecord:
    """The results.jsonl record of one module run, judged as the matrix judges a case with no
    expectation entry (`expectations.judge`).  `must_support`: an unsupported answer is a failure
    (an impl that must run everything and declared no limit for this model); `rounding_fails`: a
    rounding outcome is a failure."""
    judgement = judge(result.outcome, [m.oracle for m in result.mismatches], result.error, None, impl=impl,
                      must_support_all=must_support, reason=result.reason, rounding_fails=rounding_fails)
    axes = {axis: "" for axis in AXES}
    axes.update({"mode": mode_name(impl, mode), "layout": MODULE_LAYOUT, "capture": capture.value,
                 "interleave": "none", "device": device, "program": program_name(factory, wrap)})
    return CaseRecord(
        case_id(factory, impl, device, capture, mode, wrap), impl, Outcome(result.outcome), impl_version=version,
        axes=axes, reason=result.reason, error=result.error + "".join(f"\n(warning: {w})" for w in result.warnings),
        traceback=result.traceback, mismatches=list(result.mismatches), duration_s=result.duration_s,
        iterations=result.iterations, verdict=Verdict(judgement.verdict), verdict_note=judgement.note,
        extra={"kind": "module", "factory": factory, "wrap": list(wrap or []),
               "checkpointed": ", ".join(repr(p) for p in result.checkpointed),
               "not_wrapped": ", ".join(repr(p) for p in result.not_wrapped),
               "draws_per_forward": result.draws_per_forward, "draw_sites": len(result.draws),
               "first_divergent_draw": result.first_divergent or "", "diagnosis": result.diagnosis,
               "transformers": result.transformers, "checkpointing_api": result.checkpointing_api},
    )


def library_line(result: "ModuleResult") -> str:
    """``transformers 5.23.0; its checkpointing on through activation_checkpointing_enable``: the
    version of transformers the model comes from, and how its own checkpointing was turned on."""
    line = f"transformers {result.transformers}"
    return line + (f"; its checkpointing on through {result.checkpointing_api}" if result.checkpointing_api else "")


def head(factory: str, impl: str, device: str, capture: Capture, mode: Mode) -> str:
    return f"{impl} {factory} ({device}, {capture.value}, {mode_name(impl, mode)})"


def summary(factory: str, impl: str, device: str, capture: Capture, mode: Mode, result: "ModuleResult") -> str:
    """The text `harness module` prints for one run: the outcome (and its reason or error), what
    was checkpointed and drawn, the first divergent draw (or the diagnosis), then the mismatches
    grouped by oracle (as `repro` shows them)."""
    lines = [f"{head(factory, impl, device, capture, mode)}: {result.outcome}"]
    if result.reason:
        lines.append(result.reason)
    if result.error:
        lines.append(f"error: {result.error}")
        lines += [f"torch warned: {w}" for w in result.warnings]
    if result.outcome in ("pass", "rounding", "mismatch"):
        what = "checkpointed" if impl == AS_BUILT else "wrapped"
        paths = result.checkpointed
        shown = ", ".join(repr(p) for p in paths[:SHOWN_PATHS]) or "nothing"
        if len(paths) > SHOWN_PATHS:
            shown += f", ... ({len(paths)} in all)"
        lines.append(f"{what}: {shown}; {result.draws_per_forward} RNG draws per forward at "
                     f"{len(result.draws)} sites, {result.iterations} iterations")
    if result.not_wrapped:
        left = ", ".join(repr(p) for p in result.not_wrapped[:SHOWN_PATHS])
        more = f", ... ({len(result.not_wrapped)} in all)" if len(result.not_wrapped) > SHOWN_PATHS else ""
        lines.append(f"not wrapped: {left}{more} (matched by --wrap, but containers with no forward of their own: "
                     "the model calls their children one by one)")
    if result.transformers:
        lines.append(library_line(result))
    if result.first_divergent:
        lines.append(f"first divergent draw: {result.first_divergent}")
    elif result.diagnosis:
        lines.append(result.diagnosis)
    by_oracle: dict[str, list[str]] = {}
    for m in result.mismatches:
        by_oracle.setdefault(m.oracle, []).append(m.message())
    for oracle, found in by_oracle.items():
        lines += ["", f"{oracle} ({len(found)}):", *(f"  {line}" for line in found)]
    return "\n".join(lines)


SCRIPT = '''"""Repeats `{command}`.

It imports your factory and runs it through ckpt-rng-harness's module mode; exit 1 when the
checkpointed module still differs from the one without checkpointing, 0 when it agrees.
"""

import sys

from harness.fronts.cli import main

sys.exit(main({argv!r}))
'''


def script(argv: Sequence[str]) -> str:
    """A Python script that repeats ``python -m harness module ARGV`` (without --script and
    --report-dir): it imports the factory through the harness."""
    return SCRIPT.format(command="python -m harness " + " ".join(shlex.quote(a) for a in argv), argv=list(argv))
