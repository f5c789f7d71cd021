"""The RNG consumers a site can use: one registry entry each, with what it records.

An entry's `apply(h, own_backend)` takes the activation `h` and returns ``(out, drawn)``: the
activation the site passes on (before its weight multiplies it) and the RNG output the harness
records and compares bit for bit (the mask, the random tensor, the sampled indices; for attention
dropout the attention output, since the kernel keeps its mask).  Every op draws from the device's
default generator, so a tracker's ``fork(name)`` around it makes it draw from that stream.

`unrunnable(op, dtype, shape, device)` says why this environment cannot run an op at all (an
attention backend that this GPU, build or input does not offer), probed once per combination.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from .programs import ATTENTION_VIEWS, SDPA_OPS, SHAPES, TORCH_DTYPES, Dtype, Op, Passing, Shape

DROPOUT_P = 0.5

SHAPE_OF = {dims: shape for shape, dims in SHAPES.items()}
Apply = Callable[[torch.Tensor, bool], "tuple[torch.Tensor, torch.Tensor]"]


@dataclass(frozen=True)
class OpSpec:
    """One RNG consumer: how it runs and what it records."""

    op: Op
    apply: Apply
    records: str  # what the recorded RNG output is, for readers of a report
    draws: bool = True  # False for the site that draws nothing
    cuda_only: bool = False
    dtypes: tuple[Dtype, ...] = tuple(Dtype)
    any_shape: bool = True  # False: the attention kernels need a head dim divisible by 8
    # Its backward accumulates with atomics (run to run different bits on CUDA) unless torch's
    # deterministic mode is on: without it the reference itself would not be reproducible.
    deterministic_mode: bool = False
    # False: on CUDA even two identical runs may differ (seen on an H200, torch 2.11: efficient and
    # flash attention backward at 2^20 elements, deterministic mode or not).  The runner runs the
    # reference of such a case twice and skips the case, saying so, when the two differ.
    reproducible: bool = True


def _native_dropout(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, mask = torch.native_dropout(h, DROPOUT_P, True)
    return out, mask


def _dropout(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out = F.dropout(h, DROPOUT_P, training=True)
    return out, out


def _dropout_inplace(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out = F.dropout(h.clone(), DROPOUT_P, training=True, inplace=True)  # in place on a non-leaf
    return out, out


def _scaled(draw: Callable[[torch.Tensor], torch.Tensor]) -> Apply:
    """A site that multiplies the activation by a random tensor of its shape."""

    def apply(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = draw(h)
        return h * drawn, drawn

    return apply


def _multinomial(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.ones(h.shape, dtype=h.dtype, device=h.device)
    index = torch.multinomial(probs, h.shape[1], replacement=True)
    # Scaled by the sampled indices, not gathered: gather's backward (a scatter-add with repeated
    # indices) accumulates in a nondeterministic order on CUDA, which no checkpoint can match.
    return h * (index + 1).to(h.dtype) / h.shape[1], index


def _randperm(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.randperm(h.numel(), device=h.device)
    return h.reshape(-1)[index].view(h.shape), index


def _nodraw(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return h, h


def _sdpa_auto(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # No backend pinned and no dropout: torch picks the backend from the SDPA flags (on the CPU
    # its flash kernel, whose output differs from math's in most elements), so a flag a checkpoint
    # left changed shows in this output.
    view = ATTENTION_VIEWS[SHAPE_OF[tuple(h.shape)]]
    q = h.view(view)
    out = F.scaled_dot_product_attention(q, q, q, scale=1.0 / view[3])
    return out.reshape(h.shape), out


def _dropout_p0(h: torch.Tensor, _: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # A model built with dropout 0.0 still calls F.dropout; at p = 0 torch returns the input and
    # draws nothing, so a checkpoint must neither need nor move any stream (TransformerEngine's
    # checkpoint under capture is tested with p = 0 beside p > 0 upstream).
    out = F.dropout(h, 0.0, training=True)
    return out, out


BACKENDS = {
    Op.SDPA_MATH: "MATH", Op.SDPA_EFFICIENT: "EFFICIENT_ATTENTION",
    Op.SDPA_FLASH: "FLASH_ATTENTION", Op.SDPA_CUDNN: "CUDNN_ATTENTION",
}


def sdpa_backend(op: Op) -> "torch.nn.attention.SDPBackend":
    """The `SDPBackend` an attention op runs on."""
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, BACKENDS[op])


def sdpa_context(op: Op) -> contextlib.AbstractContextManager:
    """``sdpa_kernel(backend)`` for an attention op (a no-op context for any other op)."""
    if op not in SDPA_OPS:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend(op))


def _attention(op: Op) -> Apply:
    def apply(h: torch.Tensor, own_backend: bool) -> tuple[torch.Tensor, torch.Tensor]:
        view = ATTENTION_VIEWS[SHAPE_OF[tuple(h.shape)]]
        q = h.view(view)
        # The backend is chosen here unless the region was entered under sdpa_kernel (the
        # 'sdpa_kernel' passing), which is what tells whether a checkpoint replays that context.
        with sdpa_context(op) if own_backend else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=DROPOUT_P, scale=1.0 / view[3])
        return out.reshape(h.shape), out

    return apply


def _attention_spec(op: Op) -> OpSpec:
    half = (Dtype.BF16, Dtype.F16)
    return OpSpec(op, _attention(op), "the attention output (the kernel keeps its dropout mask)",
                  cuda_only=op is not Op.SDPA_MATH,
                  dtypes=half if op in (Op.SDPA_FLASH, Op.SDPA_CUDNN) else tuple(Dtype),
                  any_shape=op is Op.SDPA_MATH,
                  deterministic_mode=op in (Op.SDPA_EFFICIENT, Op.SDPA_FLASH),
                  reproducible=op is Op.SDPA_MATH)


# Ops whose record is the draw itself (a mask, a random tensor, sampled indices): a stream at the
# same state draws the same record again, whatever the site's input.  The others record their
# output, which depends on their input as well (F.dropout, attention): the same mask under another
# input is no stale record, and ranks whose inputs differ record different outputs.
RECORDS_THE_DRAW = frozenset(op.value for op in (
    Op.NATIVE_DROPOUT, Op.BERNOULLI, Op.RAND, Op.RANDN, Op.RAND_LIKE, Op.RANDN_LIKE, Op.RANDINT, Op.NORMAL,
    Op.UNIFORM, Op.MULTINOMIAL, Op.RANDPERM, Op.POISSON, Op.EXPONENTIAL))

REGISTRY: dict[Op, OpSpec] = {spec.op: spec for spec in (
    OpSpec(Op.NATIVE_DROPOUT, _native_dropout, "the dropout mask torch.native_dropout returns"),
    OpSpec(Op.DROPOUT, _dropout, "F.dropout's output"),
    OpSpec(Op.DROPOUT_INPLACE, _dropout_inplace, "F.dropout(inplace=True)'s output"),
    OpSpec(Op.BERNOULLI, _scaled(lambda h: torch.empty_like(h).bernoulli_(DROPOUT_P)),
           "the tensor bernoulli_(0.5) filled"),
    OpSpec(Op.RAND, _scaled(lambda h: torch.rand(h.shape, dtype=h.dtype, device=h.device)), "torch.rand's tensor"),
    OpSpec(Op.RANDN, _scaled(lambda h: torch.randn(h.shape, dtype=h.dtype, device=h.device)), "torch.randn's tensor"),
    OpSpec(Op.RAND_LIKE, _scaled(torch.rand_like), "torch.rand_like's tensor"),
    OpSpec(Op.RANDN_LIKE, _scaled(torch.randn_like), "torch.randn_like's tensor"),
    OpSpec(Op.RANDINT, _scaled(lambda h: torch.randint(1, 4, h.shape, dtype=h.dtype, device=h.device)),
           "torch.randint(1, 4)'s tensor"),
    OpSpec(Op.NORMAL, _scaled(lambda h: torch.empty_like(h).normal_(1.0, 0.5)), "the tensor normal_(1, 0.5) filled"),
    OpSpec(Op.UNIFORM, _scaled(lambda h: torch.empty_like(h).uniform_(0.5, 1.5)),
           "the tensor uniform_(0.5, 1.5) filled"),
    OpSpec(Op.MULTINOMIAL, _multinomial, "the indices torch.multinomial sampled (one row per activation row)"),
    OpSpec(Op.RANDPERM, _randperm, "the permutation torch.randperm drew"),
    # Two RNG ops outside the compiled partitioner's list of random ops (native_dropout, rand_like,
    # randn_like): a memory budget below 1.0 may recompute them with fresh draws (issue 24).
    OpSpec(Op.POISSON, _scaled(lambda h: torch.poisson(torch.full_like(h, 2.0))),
           "torch.poisson's counts (rate 2)"),
    OpSpec(Op.EXPONENTIAL, _scaled(lambda h: torch.empty_like(h).exponential_(1.0)),
           "the tensor exponential_(1) filled"),
    *(_attention_spec(op) for op in SDPA_OPS),
    OpSpec(Op.NODRAW, _nodraw, "the activation (nothing is drawn)", draws=False),
    OpSpec(Op.DROPOUT_P0, _dropout_p0, "F.dropout(p=0)'s output (nothing is drawn)", draws=False),
    # On CUDA the flags pick flash or memory-efficient attention, whose backward accumulates in a
    # run-to-run order: deterministic mode on, and the reference run twice (`reproducible`).
    OpSpec(Op.SDPA_AUTO, _sdpa_auto, "the attention output on the backend the SDPA flags choose (nothing is drawn)",
           draws=False, deterministic_mode=True, reproducible=False),
)}


# The dropout pattern of a compiled run (`harness.run.compiled`): ops whose zeros are their mask's
# zeros (or that draw nothing), and passings whose region mixes elements before its sites (autocast
# starts with a matmul) or picks an attention backend: there a zero no longer marks a dropped element.
PATTERN_OPS = frozenset({Op.NATIVE_DROPOUT, Op.DROPOUT, Op.DROPOUT_INPLACE, Op.DROPOUT_P0, Op.NODRAW})
MIXING_PASSINGS = frozenset({Passing.AUTOCAST, Passing.SDPA_KERNEL})


def has_pattern(program: Any) -> bool:
    """True when the zeros of `program`'s final activation and input gradient are its dropout
    masks' zeros: every site a dropout (or a site that draws nothing), some site draws, no region
    mixes elements (what a compiled run compares instead of per-site masks)."""
    return (program.ops() <= PATTERN_OPS and not (program.passings() & MIXING_PASSINGS)
            and any(REGISTRY[op].draws for op in program.ops()))


@contextlib.contextmanager
def determinism(ops: "Op | Iterable[Op]") -> "Iterator[None]":
    """torch's deterministic mode (warn-only: ops without a deterministic kernel still run) when
    one of `ops` has a backward that needs it (`OpSpec.deterministic_mode`); the setting is put
    back after."""
    if not any(REGISTRY[op].deterministic_mode for op in ([ops] if isinstance(ops, Op) else ops)):
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def invalid_reason(op: Op, dtype: Dtype, shape: Shape, device: str) -> str | None:
    """Why `op` cannot run with this dtype, shape or device type anywhere (None: it can)."""
    spec = REGISTRY[op]
    if spec.cuda_only and device != "cuda":
        return f"{op.value} needs a cuda device"
    if dtype not in spec.dtypes:
        return f"{op.value} has no {TORCH_DTYPES[dtype]} kernel"
    if not spec.any_shape and ATTENTION_VIEWS[shape][3] % 8:
        return f"{op.value} needs a head dim divisible by 8 (the {shape.value} shape has {ATTENTION_VIEWS[shape][3]})"
    return None


@functools.lru_cache(maxsize=None)
def unrunnable(op: Op, dtype: Dtype, shape: Shape, device: str) -> str | None:
    """Why this machine cannot run `op` on this input (an attention backend that its GPU or torch
    build does not offer for it), or None.  Probed once per combination with a real call."""
    if op not in SDPA_OPS or op is Op.SDPA_MATH:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None  # the case is skipped for want of CUDA anyway
    view = ATTENTION_VIEWS[shape]
    q = torch.zeros(view, dtype=getattr(torch, TORCH_DTYPES[dtype]), device=device, requires_grad=True)
    state = torch.cuda.get_rng_state(q.device) if q.device.type == "cuda" else None
    try:
        with sdpa_context(op):
            F.scaled_dot_product_attention(q, q, q, dropout_p=DROPOUT_P).sum().backward()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{op.value} cannot run {TORCH_DTYPES[dtype]} {tuple(view)} with dropout here: {first}"
    finally:
        if state is not None:
            torch.cuda.set_rng_state(state, q.device)
    return None


# torch.nn.attention.SDPBackend member names -> the names limits and messages use.
_BACKEND_NAMES = {"EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn", "FLASH_ATTENTION": "flash",
                  "MATH": "math"}


def _choice_names() -> "dict[int, str] | None":
    """``SDPBackend`` value -> the name limits and messages use, or None where this torch cannot
    say which backend it picks (no ``torch._fused_sdp_choice`` or no ``SDPBackend``)."""
    backend_type = getattr(getattr(torch.nn, "attention", None), "SDPBackend", None)
    if getattr(torch, "_fused_sdp_choice", None) is None or backend_type is None:
        return None
    # SDPBackend is a pybind11 enum (not iterable): look its members up by name.
    return {int(getattr(backend_type, member)): name for member, name in _BACKEND_NAMES.items()
            if hasattr(backend_type, member)}


def _chosen(q: torch.Tensor, dropout_p: float) -> str:
    """The backend torch picks for attention of `q` with this dropout ("unknown" for one not named)."""
    names = _choice_names() or {}
    return names.get(int(torch._fused_sdp_choice(q, q, q, None, dropout_p)), "unknown")


@functools.lru_cache(maxsize=None)
def default_backend(device: str, dtype: Dtype, shape: Shape, dropout: bool) -> str | None:
    """The attention backend torch picks on this machine's `device` type ("cpu" or "cuda") for
    an attention call of this dtype and shape, with dropout (p = 0.5, an input that requires
    grad, as a site's) or without, when no ``sdpa_kernel`` context chooses: what a recompute
    outside such a context runs.  "math", "flash", "efficient", "cudnn" ("unknown" for another),
    or None where this torch cannot be asked or the device is absent here.  Probed once per
    combination.  (On the CPU, torch 2.13: flash without dropout, math with it.)"""
    if _choice_names() is None or (device == "cuda" and not torch.cuda.is_available()):
        return None
    q = torch.zeros(ATTENTION_VIEWS[shape], device=device, dtype=getattr(torch, TORCH_DTYPES[dtype]),
                    requires_grad=dropout)
    try:
        return _chosen(q, DROPOUT_P if dropout else 0.0)
    except (RuntimeError, TypeError):
        return None


@functools.lru_cache(maxsize=None)
def auto_backend(dtype: Dtype, shape: Shape) -> str | None:
    """The attention backend torch picks on the current CUDA device for an ``sdpa_auto`` site of
    this dtype and shape (asked with a tensor of the site's view: ``torch._fused_sdp_choice``),
    ("unknown" for a backend not named here), or None where this torch cannot be asked.  Probed
    once per combination, like `unrunnable`.
    (On the H200, torch 2.11: memory-efficient for f32 at 64x64 and 1024x1024, cuDNN for bf16
    and f16 there, flash or math at 63x65.)"""
    if _choice_names() is None:
        return None
    q = torch.zeros(ATTENTION_VIEWS[shape], device="cuda", dtype=getattr(torch, TORCH_DTYPES[dtype]))
    return _chosen(q, 0.0)
