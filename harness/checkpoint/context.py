"""The context a region's forward ran under that its recompute in backward would not have.

Backward runs outside the caller's ``with`` blocks: a region entered under ``torch.autocast`` or
``torch.nn.attention.sdpa_kernel`` would otherwise be recomputed with full-precision matmuls or
another attention backend (whose dropout draws differently), so the recompute would not be the
forward.  `ForwardContext` takes both when the region runs and re-enters them for the recompute.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

AUTOCAST_DEVICES = ("cpu", "cuda")
# The global flags sdpa_kernel sets, read and written through torch.backends.cuda (CPU builds have
# them too: the CPU backend choice reads the same flags).
SDP_FLAGS = ("flash", "mem_efficient", "math", "cudnn")


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype] | None:
    if not hasattr(torch, "get_autocast_dtype"):  # older torch: per-device getters only
        return None
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def _sdp_flags() -> dict[str, bool]:
    backends = torch.backends.cuda
    return {name: getattr(backends, f"{name}_sdp_enabled")() for name in SDP_FLAGS
            if hasattr(backends, f"{name}_sdp_enabled") and hasattr(backends, f"enable_{name}_sdp")}


def _set_sdp_flags(flags: dict[str, bool]) -> None:
    for name, enabled in flags.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(enabled)


class ForwardContext:
    """Autocast state (per device type) and SDPA backend flags, as the forward had them."""

    def __init__(self) -> None:
        self.autocast = {d: _autocast_state(d) for d in AUTOCAST_DEVICES}
        self.cache_enabled = torch.is_autocast_cache_enabled()
        self.sdp = _sdp_flags()

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Re-enter the forward's autocast and SDPA backend choice; put the flags back after."""
        before = _sdp_flags()
        _set_sdp_flags(self.sdp)
        try:
            with contextlib.ExitStack() as stack:
                for device_type, state in self.autocast.items():
                    if state is not None:
                        enabled, dtype = state
                        stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled,
                                                           cache_enabled=self.cache_enabled))
                yield
        finally:
            _set_sdp_flags(before)
