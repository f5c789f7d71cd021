"""`repro --script FILE`: a standalone Python program that reproduces one case.

The program is `repro_template.py` with the case's axis values filled in and an implementation
block: for `torch` it needs nothing but torch; for any other impl it loads the adapter through
ckpt-rng-harness (which ships the bundled checkpoint and the negative controls).  It re-implements
the workload and the comparison on its own, so it is also an independent check of the harness.
"""

from __future__ import annotations

import re
from importlib import resources

from ..model.cases import Case, Interleave, Mode
from ..model.programs import ATTENTION_VIEWS, TORCH_DTYPES, Region, Site
from ..run.workload import case_streams

# the template is a module of this package: found as a resource, it travels wherever the package does
TEMPLATE = resources.files(__package__).joinpath("repro_template.py")

TORCH_BLOCK = '''import torch.utils.checkpoint  # noqa: E402


def make_tracker(device):
    return Tracker(device)  # the tracker semantics the harness uses (defined below)


def checkpoint(fn, *args, tracker, **kwargs):
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=REENTRANT, preserve_rng_state=True, **kwargs)
'''

ADAPTER_BLOCK = '''def _impl():
    # The implementation under test, through its ckpt-rng-harness adapter (imported on first use,
    # so a missing package is an error of the setup, exit status 2).
    from harness.impls import load

    global _IMPL
    if _IMPL is None:
        _IMPL = load(IMPL)
    return _IMPL


_IMPL = None


def make_tracker(device):
    return _impl().make_tracker(device)


def checkpoint(fn, *args, tracker, **kwargs):
    return _impl().checkpoint(fn, *args, reentrant=REENTRANT, tracker=tracker, **kwargs)
'''


def _program_literal(case: Case) -> str:
    """The case's program as the template's PROGRAM list (streams resolved for the case's layout)."""
    streams = case_streams(case)

    def item(it: object, indent: str) -> str:
        if isinstance(it, Region):
            inner = f",\n{indent}    ".join(item(child, indent + "    ") for child in it.items)
            backend = it.backend.value if it.backend else None
            return (f"(\"region\", {it.name!r}, {it.passing.value!r}, {backend!r}, [\n{indent}    {inner}], "
                    f"{it.parallel!r})")
        assert isinstance(it, Site)
        return (f"(\"site\", {it.name!r}, {it.op.value!r}, {TORCH_DTYPES[it.dtype]!r}, {streams[it.name]!r}, "
                f"{it.own_backend!r}, {it.parallel!r})")

    return "[\n    " + ",\n    ".join(item(it, "    ") for it in case.program.items()) + ",\n]"


def render(case: Case, impl: str) -> str:
    """The program's source for `case` under `impl`."""
    text = TEMPLATE.read_text()
    program = case.program
    values = {
        "CASE_ID": repr(case.id),
        "IMPL": repr(impl),
        "REENTRANT": repr(case.mode is Mode.REENTRANT),
        "LAYOUT": repr(case.layout.value),
        "CAPTURE": repr(case.capture.value),
        "DTYPE": f"torch.{TORCH_DTYPES[program.dtype]}",
        "SHAPE": repr(program.shape_dims),
        "ATTENTION_VIEW": repr(ATTENTION_VIEWS[program.shape]),
        "ITERATIONS": repr(program.iterations),
        "INTERLEAVE": repr(case.interleave is Interleave.DRAWS),
        "DEVICE": f"torch.device({case.device.value!r})",
    }
    text, count = re.subn(r"^PROGRAM = \[\n.*?^\]\n", lambda _: f"PROGRAM = {_program_literal(case)}\n", text,
                          count=1, flags=re.M | re.S)
    if count != 1:
        raise RuntimeError("repro template lacks its PROGRAM")
    for name, value in values.items():
        text, count = re.subn(rf"^{name} = .*?(  #.*)?$", f"{name} = {value}\\1", text, count=1, flags=re.M)
        if count != 1:
            raise RuntimeError(f"repro template lacks the line for {name}")
    block = TORCH_BLOCK if impl == "torch" else ADAPTER_BLOCK
    text, count = re.subn(r"^# BEGIN IMPLEMENTATION.*?^# END IMPLEMENTATION\n", lambda _: block, text,
                          count=1, flags=re.M | re.S)
    if count != 1:
        raise RuntimeError("repro template lacks its implementation block")
    return text
