"""The reference run is checked before it is trusted (README, the paragraph after the oracles).

Every oracle compares the checkpointed run with the reference, so a reference that did not do what
the case says makes every comparison vacuous: a tracker whose ``fork()`` does nothing lets a
tracked layout "pass" without a single tracked draw.  Before comparing, the harness checks:

* every site on a tracker stream advanced that stream and not the device's default generator
  (seen on every eager draw; draws inside a CUDA-graph capture are not watched);
* every site on the default generator advanced it;
* every site drew in every iteration, and no RNG output is constant (a mask all-zero or all-one,
  a random tensor with one value: with thousands of elements either means the op did not draw);
* a site that draws nothing (the ``nodraw`` op) advanced no stream;
* in the shared layout, a draw through the alias advances the stream it aliases (a tracker whose
  `add_alias` makes a copy would make the alias checks true by construction).

A failed check is a `ReferenceCheckError` naming the adapter: the case is an ``error``, never a pass.
"""

from __future__ import annotations

from typing import Collection, Mapping

import torch

from ..errors import HarnessError
from .compare import int_view
from .records import FORWARD, RunRecord


class ReferenceCheckError(HarnessError, RuntimeError):
    """The reference run did not draw the way its case says; one line naming the adapter."""


def _stream_problems(record: RunRecord, site_streams: Mapping[str, str | None], device: str,
                     drawing: Collection[str]) -> list[str]:
    problems = []
    for site, stream in site_streams.items():
        if not record.watch.seen.get(site):
            problems.append(f"site {site} never drew outside a graph capture, so its stream could not be checked")
        for default_moved, stream_moved in record.watch.seen.get(site, []):
            if site not in drawing:
                if not (default_moved or stream_moved):
                    continue
                problems.append(f"site {site} draws nothing but advanced "
                                f"{'the default generator (' + device + ')' if default_moved else repr(stream)}")
            elif stream is not None and not stream_moved:
                problems.append(f"tracker fork({stream!r}) did not switch streams: site {site} left "
                                f"{stream!r} where it was" + (f" and drew from the default generator ({device})"
                                                               if default_moved else ""))
            elif stream is not None and default_moved:
                problems.append(f"tracker fork({stream!r}) did not switch streams: site {site} also "
                                f"advanced the default generator ({device})")
            elif stream is None and not default_moved:
                problems.append(f"site {site} on the default generator ({device}) did not advance it")
            else:
                continue
            break  # one line per site is enough
    return problems


def _mask_problems(record: RunRecord, sites: list[str], iterations: int) -> list[str]:
    problems, masks = [], []
    for it in range(iterations):
        for site in sites:
            drawn = record.draws(it, site, FORWARD)
            if not drawn:
                problems.append(f"site {site} drew no mask in iteration {it}")
            masks += [(site, it, mask) for mask in drawn]
    by_device: dict[torch.device, list[tuple[str, int, torch.Tensor]]] = {}
    for site, it, mask in masks:
        by_device.setdefault(mask.device, []).append((site, it, mask))
    for items in by_device.values():  # one host sync per device
        flags = torch.stack([_constant(m) for _, _, m in items]).tolist()
        for (site, it, mask), constant in zip(items, flags):
            if not constant:
                continue
            if mask.dtype == torch.bool:
                what = f"all-{'one' if mask.flatten()[0] else 'zero'}"
                problems.append(f"the mask of site {site} in iteration {it} is {what}")
            else:
                problems.append(f"the RNG output of site {site} in iteration {it} is constant "
                                f"({mask.flatten()[0].item()!r} everywhere)")
    return problems


def _constant(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: every element of `t` equals its first (compared as integers: NaN-safe)."""
    flat = int_view(t).flatten()
    return (flat == flat[0]).all()


def check_reference(record: RunRecord, site_streams: Mapping[str, str | None], iterations: int,
                    device: str, impl: str, drawing: Collection[str] | None = None) -> None:
    """Raise `ReferenceCheckError` when the reference run of `impl` did not draw as its case says.
    `drawing` names the sites whose op draws (default: every site)."""
    drawing = list(site_streams) if drawing is None else drawing
    problems = _stream_problems(record, site_streams, device, drawing)
    problems += [record.alias_problem] if record.alias_problem else []
    problems += _mask_problems(record, [s for s in site_streams if s in drawing], iterations)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReferenceCheckError(f"reference check failed for impl {impl!r}: {problems[0]}{more}")
