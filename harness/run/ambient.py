"""Ambient state: the process state a checkpoint is known to touch besides RNG streams.

A checkpoint recomputes its region in backward under the state the forward ran with, so it saves
and sets state around the recompute: torch.utils.checkpoint saves each device's autocast settings
and the grad mode (reentrant), Megatron-core and TransformerEngine save autocast and their FP8
state, DeepSpeed the CUDA stream it recomputes on, and a checkpoint that replays an attention
region may set the SDPA backend flags the forward chose.  Whatever it sets it must put back: a
leaked flag changes every later computation that reads it (an attention call that picks its own
backend, a later autocast region) without any RNG stream being wrong.

`snapshot` reads each piece (`PIECES`, those this torch build has: detected by capability, not
version) into a plain dict the ambient oracle compares with the reference's at the same point
(`check.ambient`);
`preserved` puts every settable piece back after a case, so a leaking impl cannot poison the
cases after it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Piece:
    """One piece of ambient state: its name in messages, how to read it, how to put a value back."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None] | None = None


def _sdpa_pieces() -> list[Piece]:
    backends = torch.backends.cuda
    pieces = []
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        getter, setter = getattr(backends, f"{kind}_sdp_enabled", None), getattr(backends, f"enable_{kind}_sdp", None)
        if getter is not None and setter is not None:
            pieces.append(Piece(f"sdpa {kind} enabled", getter, setter))
    return pieces


def _autocast_pieces() -> list[Piece]:
    # The device-type forms (torch >= 2.4) read one device's state; older builds are not served.
    if not (hasattr(torch, "get_autocast_dtype") and hasattr(torch, "set_autocast_dtype")):
        return []
    pieces = []
    for device in AUTOCAST_DEVICES:
        pieces.append(Piece(f"autocast {device} enabled", lambda d=device: torch.is_autocast_enabled(d),
                            lambda value, d=device: torch.set_autocast_enabled(d, value)))
        pieces.append(Piece(f"autocast {device} dtype", lambda d=device: torch.get_autocast_dtype(d),
                            lambda value, d=device: torch.set_autocast_dtype(d, value)))
    if hasattr(torch, "is_autocast_cache_enabled"):
        pieces.append(Piece("autocast cache enabled", torch.is_autocast_cache_enabled,
                            torch.set_autocast_cache_enabled))
    return pieces


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


CUDNN_FLAGS = ("enabled", "benchmark", "deterministic", "allow_tf32")


def _cudnn() -> tuple[bool, ...]:
    return tuple(getattr(torch.backends.cudnn, flag) for flag in CUDNN_FLAGS)


def _set_cudnn(value: tuple[bool, ...]) -> None:
    for flag, x in zip(CUDNN_FLAGS, value):
        setattr(torch.backends.cudnn, flag, x)


def _cuda_pieces() -> list[Piece]:
    """The current CUDA device and stream, read only where CUDA is initialised (reading them must
    not initialise it).  A stream is compared by its role, not its address: the runs of a case use
    different side streams for the same purpose (`stream_role`)."""
    def device() -> Any:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def stream() -> Any:
        return torch.cuda.current_stream() if torch.cuda.is_initialized() else None

    def set_device(value: Any) -> None:
        if value is not None:
            torch.cuda.set_device(value)

    def set_stream(value: Any) -> None:
        if value is not None:
            torch.cuda.set_stream(value)

    return [Piece("cuda current device", device, set_device), Piece("cuda current stream", stream, set_stream)]


PIECES: tuple[Piece, ...] = (
    *_sdpa_pieces(),
    *_autocast_pieces(),
    Piece("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
    Piece("inference mode", torch.is_inference_mode_enabled),
    Piece("deterministic algorithms (enabled, warn only)", _deterministic, _set_deterministic),
    Piece("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    Piece("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    Piece("cudnn (enabled, benchmark, deterministic, allow_tf32)", _cudnn, _set_cudnn),
    *_cuda_pieces(),
)
STREAM_PIECE = "cuda current stream"


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle() -> int | None:
    """The current CUDA stream's handle (its ``cuda_stream``), or None before CUDA is initialised.
    Through torch's binding for it where this build has one: building a `torch.cuda.Stream` to read
    the handle cost about 50 us, and the ambient oracle reads it at every drawing site (issue 26)."""
    if not torch.cuda.is_initialized():
        return None
    if _RAW_STREAM is not None:
        return _RAW_STREAM(torch.cuda.current_device())
    return torch.cuda.current_stream().cuda_stream


class StreamRoles:
    """Names the current CUDA stream by its role, not its address: "the forward's stream" (the one
    current when the run's forward began, `anchor`) or "another stream".  The two runs of a case
    get different side streams from the pool for the same purpose, so addresses never compare."""

    def __init__(self) -> None:
        self._anchor: int | None = None

    def anchor(self) -> None:
        """The stream current now is the forward's (called as each forward begins)."""
        handle = stream_handle()
        if handle is not None:
            self._anchor = handle

    def role(self, handle: int | None) -> str | None:
        """The role of the stream with this handle (`stream_handle`); None for no stream."""
        if handle is None:
            return None
        return "the forward's stream" if handle == self._anchor else "another stream"


def snapshot(roles: StreamRoles, in_backward: bool = False) -> dict[str, Any]:
    """Every piece of ambient state now, by name, as values that compare with ``==`` (dtypes,
    booleans, strings; the CUDA stream as its role).  `in_backward`: read inside autograd's
    backward, where the engine itself runs each node on the stream of its forward op and puts the
    caller's back after: the stream there is the engine's choice, not the checkpoint's (left out)."""
    state = {}
    for piece in PIECES:
        if in_backward and piece.name == STREAM_PIECE:
            continue
        state[piece.name] = roles.role(stream_handle()) if piece.name == STREAM_PIECE else piece.get()
    return state


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Every settable piece of ambient state put back as it was on exit (the stream and device
    first, so the rest is set on the right device)."""
    saved = [(piece, piece.get()) for piece in PIECES if piece.set is not None]
    saved.sort(key=lambda item: not item[0].name.startswith("cuda"))
    try:
        yield
    finally:
        for piece, value in saved:
            if piece.get() != value:
                piece.set(value)
