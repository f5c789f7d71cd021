"""Bitwise comparison of tensors through integer views, producing `Mismatch` records.

Never `allclose`, never `torch.equal` alone (NaN != NaN) and never `assert_close(rtol=0, atol=0)`
(it equates +0.0 and -0.0): two tensors are equal here when their bit patterns are equal.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from ..results import Mismatch

# Floating dtypes compared through a same-width integer view.
_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.bool: torch.uint8,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _INT_VIEW[getattr(torch, _name)] = torch.uint8


def int_view(tensor: torch.Tensor) -> torch.Tensor:
    """The same bytes as an integer tensor (contiguous), so equality means equal bit patterns."""
    if tensor.requires_grad:  # a copied record never does: no op where none is needed
        tensor = tensor.detach()
    if tensor.is_quantized:  # the stored integers (int_repr), not the dequantized floats
        return tensor.int_repr().contiguous()
    tensor = tensor.contiguous()
    if tensor.dtype in _INT_VIEW:
        return tensor.view(_INT_VIEW[tensor.dtype])
    if tensor.is_complex():
        return int_view(torch.view_as_real(tensor))
    if tensor.is_floating_point():
        raise TypeError(f"no integer view known for {tensor.dtype}")
    return tensor


def _show(tensor: torch.Tensor, flat_index: int) -> str:
    """An element as value plus bit pattern for floats (so -0.0 and NaN payloads are visible)."""
    value = tensor.reshape(-1)[flat_index]
    if tensor.dtype == torch.bool:
        return str(bool(value))
    if tensor.is_floating_point():
        bits = int(int_view(value.reshape(1)).item())
        width = tensor.element_size() * 2
        return f"{value.item()!r} (0x{bits & ((1 << (width * 4)) - 1):0{width}x})"
    return str(value.item())


def _index(shape: torch.Size, flat_index: int) -> Any:
    if len(shape) <= 1:
        return flat_index
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(index))


def bitwise_diff(
    got: torch.Tensor, expected: torch.Tensor, *, oracle: str, subject: str, iteration: int
) -> Mismatch | None:
    """None when `got` and `expected` have the same dtype, shape and bits; else a `Mismatch`."""
    total = expected.numel()
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return Mismatch(
            oracle, subject, iteration, count=total, total=total,
            detail=f"got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}",
        )
    a, b = int_view(got), int_view(expected.to(got.device))
    differs = (a != b).reshape(-1)
    count = int(differs.sum().item())
    if count == 0:
        return None
    first = int(differs.nonzero()[0].item())
    return Mismatch(
        oracle, subject, iteration, count=count, total=total,
        first_index=_index(got.shape, first),
        got=_show(got.detach().cpu(), first), expected=_show(expected.detach().cpu(), first),
    )


def scaled_difference(got: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float | None:
    """The largest element difference of two floating tensors of one shape and dtype, in units of
    the dtype's machine epsilon times the larger tensor's largest magnitude (or `floor`, where that
    is larger: the magnitude of the terms a sum of cancelling terms was made of): a different order
    of floating-point sums over such terms differs by a few of these units.  0.0 for tensors with
    no magnitude; None where dtype or shape differ, for non-floating tensors and non-finite values."""
    if got.dtype != expected.dtype or got.shape != expected.shape or not got.is_floating_point():
        return None
    a, b = got.detach().double().cpu(), expected.detach().double().cpu()
    if a.numel() == 0:
        return 0.0
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return None
    scale = max(float(a.abs().max()), float(b.abs().max()), floor)
    if scale == 0.0:
        return 0.0
    return float((a - b).abs().max()) / (scale * torch.finfo(got.dtype).eps)


# A repeat as likely as this (or likelier) can be chance; below it, a repeated mask is stale RNG.
CHANCE_OF_REPEAT = 1e-6


def repeat_chance(now: torch.Tensor, before: torch.Tensor) -> float:
    """How likely an independent draw repeats `before` exactly, for a Bernoulli mask (bool, or
    values 0 and 1 only, as ``bernoulli_`` draws): (p^2 + (1-p)^2)^n, p the fraction of ones over
    both, n the elements of one.  0.0 for anything else (a random float tensor, indices, a Philox
    seed and offset): those never repeat by chance."""
    values = torch.cat([now.detach().reshape(-1), before.detach().reshape(-1)])
    if values.numel() == 0 or values.is_complex():
        return 0.0
    if values.dtype != torch.bool:
        if not bool(((values == 0) | (values == 1)).all()):
            return 0.0
    p = float((values != 0).double().mean())
    return (p * p + (1 - p) * (1 - p)) ** now.numel()


def any_differences(pairs: list[tuple[torch.Tensor, torch.Tensor]],
                    end_to_end: bool | None = None) -> list[bool]:
    """For each pair, whether dtype, shape or any bit differs; one host sync per device in all.

    On an accelerator (`end_to_end` None or True) the per-element work stays on the tensors'
    device and takes a handful of kernel launches whatever the number of pairs (issue 26: one
    comparison and one reduction per pair cost more launch overhead than the comparisons
    themselves): the pairs' integer views of one device and dtype are laid end to end, compared at
    once, and the running count of differing elements read at each pair's end; only one count per
    pair comes back.  On the CPU (`end_to_end` None or False) there are no launches or syncs to
    save, so each pair's integer views are compared by `torch.equal`, which reads them once: laying
    them end to end copies them, and the running count is a sequential scan over all of them
    (issue 42: it took 27 % of a bundled pass over the CPU matrix).
    """
    flags: list[bool | None] = [None] * len(pairs)
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for index, (got, expected) in enumerate(pairs):
        if got.dtype != expected.dtype or got.shape != expected.shape:
            flags[index] = True
            continue
        if got.numel() == 0:
            flags[index] = False
            continue
        if expected.device != got.device:
            expected = expected.to(got.device)
        a, b = int_view(got), int_view(expected)
        laid_end_to_end = a.device.type != "cpu" if end_to_end is None else end_to_end
        if not laid_end_to_end:
            flags[index] = not torch.equal(a, b)  # integer views: NaN payloads and -0.0 differ
            continue
        groups.setdefault((a.device, a.dtype), []).append((index, a.reshape(-1), b.reshape(-1)))
    counts: dict[torch.device, list[tuple[list[int], torch.Tensor]]] = {}
    for (device, _), items in groups.items():
        differs = torch.cat([a for _, a, _ in items]) != torch.cat([b for _, _, b in items])
        running = differs.cumsum(0)
        ends = torch.tensor(list(itertools.accumulate(a.numel() for _, a, _ in items)), device=device) - 1
        at_ends = running[ends]
        per_pair = torch.diff(at_ends, prepend=at_ends.new_zeros(1))
        counts.setdefault(device, []).append(([index for index, _, _ in items], per_pair))
    for groups_of_device in counts.values():
        values = torch.cat([per_pair for _, per_pair in groups_of_device]).tolist()  # the one sync
        indices = [index for group_indices, _ in groups_of_device for index in group_indices]
        for index, value in zip(indices, values):
            flags[index] = value > 0
    return [bool(f) for f in flags]
