"""Where the live generators are: the default generator of a device, and every live stream."""

from __future__ import annotations

from typing import Iterable

import torch


def default_generator(device: "torch.device | str") -> torch.Generator:
    """The default generator that RNG ops on `device` draw from."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    raise ValueError(f"unsupported device type {device.type!r}: expected cpu or cuda")


def device_default_generators() -> list[torch.Generator]:
    """The CPU generator plus, once CUDA is initialized, every CUDA device's default generator.

    All CUDA devices are included because a region can reach a device through a closure or a
    keyword argument that no argument scan would see.
    """
    gens = [torch.default_generator]
    if torch.cuda.is_initialized():  # implies available
        gens.extend(torch.cuda.default_generators)
    return gens


def unique(generators: Iterable[torch.Generator]) -> list[torch.Generator]:
    """Drop repeated generator objects (aliases), keeping first-seen order."""
    seen: set[int] = set()
    out = []
    for gen in generators:
        if id(gen) not in seen:
            seen.add(id(gen))
            out.append(gen)
    return out
