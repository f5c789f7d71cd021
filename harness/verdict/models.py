"""Known bugs as models (issue 40): a named behaviour with parameters says what a checkpoint does
differently in a case, and from that which error it raises or which oracles fail.

An expectation entry names a behaviour instead of a predicate over facts::

    [[expect]]
    name = "torch-ignores-tracker"
    impl = ["torch", "torch-partial"]
    model = { behaviour = "unsaved-streams", streams = "tracker" }
    reason = "..."

Its facts (mode, device, ...), where it has any, only scope it; the behaviour decides, case by
case, whether the bug can show and how.  The library (`BEHAVIOURS`; streams are ``tracker``,
``device``, ``cpu`` or ``all``):

``unsaved-streams`` (``streams``; ``passing``: only regions entered so)
    neither saved nor restored: a recompute draws them where they are live, and leaves them ahead.
``not-restored`` (``streams``)
    rewound for the recompute, but left where the recompute ended.
``extra-draw`` (``streams``)
    the checkpoint draws from them once on entering a region, before its snapshot.
``rewound-after-forward`` (``streams``)
    put back where they were when a region's forward returns.
``snapshot-slots`` (``slots``) / ``snapshots-frozen`` (``after_steps``)
    snapshots kept in a fixed pool that a later snapshot overwrites / per region call of a step,
    refreshed in the first steps only: a recompute may rewind to another call's state.
``saved-rng-ops`` (``ops``, ``first = true`` or ``every = true``; ``mutated_message``)
    a selective policy keeps these RNG ops' outputs (or each region's first seeded op, its inner
    regions' included; or every one): the recompute does not redraw them, so the later draws of
    their stream shift; an output the op changes in place (`effects.IN_PLACE`) raises.
``skips-save-regions`` (``restored``)
    a SAVE region's body (``save(...)``) is not rerun; its hooks put back what they snapshot after it.
``refuses-input`` (``passing``, ``message``; ``recompute``)
    raises when a region is entered that way (the forward stops there); with ``recompute = true``
    the forward goes through and the recompute of such a region (one with sites of its own, which
    backward recomputes) raises instead.
``input-invisible`` (``passing``, ``message``; reentrant cases only)
    an autograd Function differentiates only its direct tensor arguments: a region entered that
    way gets no gradient path, is never recomputed, and nothing upstream of it gets a gradient;
    backward raises where the loss, or a recomputed region's output, no longer requires grad
    (``recompute_raises = false``: only where the loss does; such a recompute goes on silently).
``context-not-replayed`` (``context``: ``sdpa_kernel`` or ``autocast``; ``message``)
    the recompute runs outside the region's context: attention on the backend torch picks by
    itself on this machine (`Machine.backend`), an autocast region's matmul in the program's
    dtype.  Where that changes anything, a non-reentrant recompute raises where the entry gives a
    ``message``; otherwise the gradients differ (and a mask where the changed site draws).
    ``raises_from`` (a table: forward backend -> message; ``sdpa_kernel``): what the recompute
    raises where the forward ran on that backend; a backend it does not name raises ``message``
    if given, else nothing (a checkpoint that hands the backward whatever the recompute saved,
    by position: some backends' backward takes the other backend's tensors silently).  With
    a selective policy (``saved-rng-ops``) ``message`` is what a recompute op the policy caches
    raises (it is not in the cache), ``recomputed_message`` what one it recomputes raises.  Under
    ``autocast``, ``attention_message`` is what a non-reentrant backward raises where attention
    autocast ran in bfloat16 is recomputed in another dtype (its backward comes before the
    matmul's).  ``mixed_message`` (a checkpoint with no recompute check): what only a matmul of
    two dtypes raises (a region entered with another dtype than its matrix's), in either mode.
``inert-fork`` (``message``)
    the tracker's fork() switches to no stream: the reference check refuses the run where a
    tracked site draws (and in the shared layout).
``leaks-ambient`` (``undone_by``)
    the checkpoint leaves process state changed, unless a context the region sits in puts it back.
``early-stop``
    a trait: the non-reentrant recompute stops at the region's last own site (torch's).
``nested-frames``
    a trait: an inner region's inputs are saved by its enclosing region's frame, so the enclosing
    region recomputes before its inner ones (torch's non-reentrant checkpoint).
``input-keyed-snapshots``
    eager snapshots kept in a pool keyed by the input tensor a region is called with (its
    ``id()``): regions called with one tensor (parallel items, an inner region in its enclosing
    region's first group) share a key, the later snapshot replaces the earlier, and a recompute
    rewinds to what its key holds.  A closure region passes no tensor and keeps its own.
``grouped-input-gradient``
    not an RNG bug: its backward hands back a region's input gradient already summed over the
    region's own reads of it, and the engine adds the input's other reads to that sum; where a
    top-level region reads its input more than once and a later parallel item reads it too, the
    reference adds the terms one by one (the later reader's first), so the gradient differs by
    rounding (seen with Megatron's CheckpointWithoutOutput; the sums can round alike by chance).
    ``passing``: only regions entered so; ``nested = true``: regions at any depth (a checkpoint
    that sums at every level).
``host-rewind`` (``per_capture``)
    under separate forward and backward graphs (CUDA) its snapshots and rewinds are host values,
    relative to the graph being captured: the recompute draws at the backward graph's base plus
    the forward's offset.  Up to torch 2.13 a generator's graphs share one device seed/offset
    pair, refilled on replay by a graph whose net increment is not zero (another micro-batch's
    graph between forward and backward, or a backward graph its recompute leaves moved), so the
    rewind lines up only where nothing refilled it; ``per_capture = true`` (torch >= 2.14): every
    graph has its own pair, filled at each replay, and it never does.  The streams' host offset
    advances by each graph's increment: a backward graph left moved moves the next forward.
``fresh-recompute``
    compiled (`harness.run.compiled`): the partitioner moves the program's RNG ops into the
    backward graph and recomputes them there from the live generator, with fresh randomness (a
    budget that is not RNG-aware), in regions or not (one budget covers the whole graph).  Where
    some site draws and the program has a region: the gradients, the stream after backward
    (it ends ahead) and so the next iteration's outputs differ; where the dropout pattern stands for
    the masks (`ops.has_pattern`), also the pattern's recompute-mask and its next forward-mask.
    Which programs a partitioner recomputes at a budget above 0 is its min-cut choice, not
    modelled: the entry's scope (or a ``pass`` entry before it) says where it keeps the draws.
    ``observed = true``: only where the run saw RNG ops in the backward graph (the machine fact
    ``compiled.backward_rng``, `harness.run.partition_watch`: inductor); where nobody looked, the
    model claims nothing, and later entries decide.
``rank-zero-rewind``
    under ``--ranks N`` (an entry with ``ranks``), on every rank but rank 0, a recompute rewinds
    each stream seeded per rank (the tracked, context-parallel and model-and-context-parallel
    streams, `rank_context`) to rank 0's state at that position (one snapshot for all ranks, or a
    reseed from the seed every rank shares): its rerun draws from such a stream are rank 0's
    numbers, so recompute-mask, the gradients they feed and rank-streams fail; every stream ends
    where it should (the checkpoint puts back its own live state).  ``axes`` (``tp``, ``cp``):
    only along these axes of the layout, to the state of the rank at 0 on them with this rank's
    other coordinates (a snapshot shared across each context-parallel group: ``axes = "cp"``, the
    context-parallel and model-and-context-parallel streams, and only where CP > 1).
``emptied-argument``
    non-reentrant: the checkpoint empties the tensor argument of each region after its forward
    (DeepSpeed's ``partition_activations`` keeps only its slice, ``arg.data = torch.empty([])``)
    and refills it only in that region's own recompute.  A closure region that reads such an
    argument as is (an enclosing region's input, however many closure regions between) and
    recomputes before its owner does (or its owner never recomputes: no sites of its own) runs on
    an empty tensor: its masks (recompute-mask) and its gradients are wrong, silently; where it
    calls a region's checkpoint on the scalar first, ``message`` is what raises (the harness's
    check of that call's output, unlike its input; an autocast region's matmul), where it first
    runs an op that needs dimensions (multinomial, attention), ``scalar_message``.

`predict` composes every behaviour an impl has in a case (`effects.effects_of`): the first error
wins (forward; the start of backward; then the recomputes in the order backward runs them, and the
site within one), else the union of the failed oracles, the draws replayed by `replay.replay`.  A
model that predicts no failure does not claim the case: where it passes, it passes; where it
fails, nothing explains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .. import rank_context
from ..errors import UsageError
from ..model import ops
from ..model.cases import Case
from ..model.programs import PER_RANK_AXES, Op, Passing, Site, per_rank_codes
from .effects import STREAM_KINDS, effects_of
from .replay import replay

CONTEXTS = ("sdpa_kernel", "autocast")
RANK_AXES = tuple(sorted({axis for axes in PER_RANK_AXES.values() for axis in axes}))  # `rank-zero-rewind`'s axes
BEHAVIOURS = {
    "unsaved-streams": {"streams", "passing"},
    "refuses-input": {"passing", "message", "recompute"},
    "input-invisible": {"passing", "message", "recompute_raises"},
    "context-not-replayed": {"context", "message", "raises_from", "recomputed_message", "attention_message",
                             "mixed_message"},
    "saved-rng-ops": {"ops", "first", "every", "mutated_message"},
    "not-restored": {"streams"},
    "extra-draw": {"streams"},
    "rewound-after-forward": {"streams"},
    "snapshot-slots": {"slots"},
    "snapshots-frozen": {"after_steps"},
    "inert-fork": {"message"},
    "leaks-ambient": {"undone_by"},
    "skips-save-regions": {"restored"},
    "early-stop": set(),
    "nested-frames": set(),
    "host-rewind": {"per_capture"},
    "input-keyed-snapshots": set(),
    "grouped-input-gradient": {"passing", "nested"},
    "fresh-recompute": {"observed"},
    "rank-zero-rewind": {"axes"},
    "emptied-argument": {"message", "scalar_message"},
}
REQUIRED = {"unsaved-streams": {"streams"}, "refuses-input": {"passing", "message"},
            "input-invisible": {"passing", "message"}, "context-not-replayed": {"context"},
            "saved-rng-ops": set(), "not-restored": {"streams"}, "extra-draw": {"streams"},
            "early-stop": set(), "nested-frames": set(),
            "rewound-after-forward": {"streams"}, "snapshot-slots": {"slots"},
            "snapshots-frozen": {"after_steps"}, "inert-fork": {"message"}, "leaks-ambient": set(),
            "skips-save-regions": set(), "host-rewind": set(),
            "input-keyed-snapshots": set(), "grouped-input-gradient": set(), "fresh-recompute": set(),
            "rank-zero-rewind": set(), "emptied-argument": set()}

class ModelError(UsageError):
    """A malformed model table; the message is one line."""


@dataclass(frozen=True)
class Model:
    """A behaviour of the library and its parameters (as the entry wrote them, validated)."""

    behaviour: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={_param(v)}" for k, v in self.params if not k.endswith("message"))
        return f"{self.behaviour}({shown})"


def _param(value: Any) -> str:
    if isinstance(value, tuple):  # a list, or a table's sorted pairs (its keys shown)
        return "|".join(v[0] if isinstance(v, tuple) else v for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_model(raw: Any, where: str) -> Model:
    """An entry's ``model`` table -> `Model`; anything malformed raises `ModelError` (one line)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("behaviour"), str):
        raise ModelError(f"{where} model must be a table with a behaviour ({', '.join(BEHAVIOURS)})")
    name = raw["behaviour"]
    if name not in BEHAVIOURS:
        raise ModelError(f"{where} model behaviour {name!r} is none of {', '.join(BEHAVIOURS)}")
    keys = set(raw) - {"behaviour"}
    unknown = sorted(keys - BEHAVIOURS[name])
    if unknown:
        raise ModelError(f"{where} model {name} has no parameter {unknown[0]!r}; its parameters: "
                         f"{', '.join(sorted(BEHAVIOURS[name]))}")
    missing = sorted(REQUIRED[name] - keys)
    if missing:
        raise ModelError(f"{where} model {name} needs {', '.join(missing)}")
    params: dict[str, Any] = {}
    for key in sorted(keys):
        value = raw[key]
        if key in ("message", "mutated_message", "recomputed_message", "attention_message", "mixed_message",
                   "scalar_message"):
            import re

            if not isinstance(value, str):
                raise ModelError(f"{where} model {key} must be a string (a regular expression)")
            try:
                re.compile(value)
            except re.error as exc:
                raise ModelError(f"{where} model {key} {value!r} is not a regular expression: {exc}") from None
            params[key] = value
        elif key == "raises_from":
            params[key] = _backend_messages(value, where)
        elif key in ("slots", "after_steps"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"{where} model {key} must be a positive integer, not {value!r}")
            params[key] = value
        elif key in ("first", "every", "recompute_raises", "per_capture", "recompute", "nested", "observed"):
            if not isinstance(value, bool):
                raise ModelError(f"{where} model {key} must be true or false")
            params[key] = value
        else:
            known = {"streams": STREAM_KINDS, "restored": STREAM_KINDS, "passing": [p.value for p in Passing],
                     "context": CONTEXTS,
                     "ops": [o.value for o in Op], "undone_by": [p.value for p in Passing],
                     "axes": RANK_AXES}[key]
            items = value if isinstance(value, list) else [value]
            bad = [v for v in items if v not in known]
            if not items or bad:
                raise ModelError(f"{where} model {key} {bad[0] if bad else value!r} is none of {', '.join(known)}")
            params[key] = tuple(items)
    if name == "saved-rng-ops" and [bool(params.get("ops")), bool(params.get("first")),
                                    bool(params.get("every"))].count(True) != 1:
        raise ModelError(f"{where} model saved-rng-ops needs one of ops (a list), first = true or every = true")
    return Model(name, tuple(params.items()))


ATTENTION_BACKENDS = ("math", "efficient", "flash", "cudnn")


def _backend_messages(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """``raises_from``: a table of attention backend -> regular expression, as sorted pairs."""
    import re

    if not isinstance(value, Mapping) or not value:
        raise ModelError(f"{where} model raises_from must be a table of backend = message "
                         f"({', '.join(ATTENTION_BACKENDS)})")
    for backend, message in value.items():
        if backend not in ATTENTION_BACKENDS:
            raise ModelError(f"{where} model raises_from {backend!r} is none of {', '.join(ATTENTION_BACKENDS)}")
        if not isinstance(message, str):
            raise ModelError(f"{where} model raises_from {backend} must be a string (a regular expression)")
        try:
            re.compile(message)
        except re.error as exc:
            raise ModelError(f"{where} model raises_from {backend} {message!r} is not a regular expression: "
                             f"{exc}") from None
    return tuple(sorted(value.items()))


# The facts a run hands the models besides what they probe: the rank layout of a `--ranks` run,
# and what a compiled run's backward graph redraws (`harness.run.partition_watch`).
RANKS_LAYOUT = "ranks.layout"
BACKWARD_RNG = "compiled.backward_rng"


class Machine:
    """What the installed torch does on the machine a case ran on, as far as models ask: the
    attention backend it picks when no context chooses.  Answers come from `known` (a record's
    ``machine_facts``) or, where `probe` is set, from asking torch here (`ops.default_backend`);
    every answer given is kept in `asked`, for the record."""

    def __init__(self, known: Mapping[str, Any] | None = None, probe: bool = True) -> None:
        self.known = dict(known or {})
        self.probe = probe
        self.asked: dict[str, Any] = {}

    def backend(self, device: str, site: Site, shape: Any, dtype: Any = None) -> "str | None":
        """The backend an attention site of this shape runs on by itself, in `dtype` (default the
        site's own; under autocast the caller passes autocast's) (None: unknown)."""
        dropout = ops.REGISTRY[site.op].draws
        dtype = dtype or site.dtype
        key = f"sdpa.{device}.{dtype.value}.{shape.value}.{'dropout' if dropout else 'no-dropout'}"
        if key in self.known:
            value = self.known[key]
        elif self.probe:
            value = ops.default_backend(device, dtype, shape, dropout)
        else:
            value = None
        self.asked[key] = value
        return value


    def backward_rng(self) -> "list[str] | None":
        """The RNG ops a compiled checkpointed run's backward graph held (``compiled.backward_rng``,
        seen by the run: `harness.run.partition_watch`; empty: none); None where nobody looked."""
        value = self.known.get(BACKWARD_RNG)
        if value is not None:
            self.asked[BACKWARD_RNG] = value
        return value

    def per_rank_streams(self, axes: "Sequence[str] | None" = None) -> frozenset[str]:
        """The stream codes (`programs.PER_RANK_AXES`) whose seeds differ between some ranks of
        the run's layout along `axes` (None: any axis) (``ranks.layout``, `RankContext.label`,
        known from the run; asked here:
        this process's)."""
        if RANKS_LAYOUT in self.known:
            value = self.known[RANKS_LAYOUT]
        else:
            value = rank_context.current().label() if self.probe else None
        self.asked[RANKS_LAYOUT] = value
        return per_rank_codes(rank_context.sizes(value) if value else {"tp": 2, "cp": 1}, axes)  # unknown: TP = all


LOCAL = Machine()


@dataclass(frozen=True)
class Prediction:
    """What the models of an impl say a case does: ``pass``, a ``mismatch`` with the oracles that
    must fail, or an ``error`` whose text matches `message`; the entries (indexes into the
    list given to `predict`) whose behaviour decides it, the first one deciding, and why."""

    outcome: str
    oracles: tuple[str, ...] = ()
    message: str = ""
    causes: tuple[int, ...] = ()
    why: tuple[str, ...] = ()


def predict(models: Sequence[Model], case: Case, machine: Machine = LOCAL) -> Prediction:
    """What an impl with these behaviours (an entry's each, in file order) does in `case`."""
    effects = effects_of(models, case, machine)
    if effects.raised:
        raised, index = min(effects.raised, key=lambda pair: (pair[0].phase, pair[0].order, pair[0].at, pair[1]))
        return Prediction("error", message=raised.message, causes=(index,), why=(raised.why,))
    causes = {oracle: set(found) for oracle, found in effects.mismatch.items()}
    for oracle, found in replay(case, effects, effects.reached).items():
        causes.setdefault(oracle, set()).update(found)
    if not causes:
        return Prediction("pass")
    deciding = sorted({i for found in causes.values() for i in found if i >= 0})
    why = [line for i in deciding for line in effects.why.get(i, [])]
    oracles = tuple(oracle for oracle in ("forward-mask", "recompute-mask", "gradient", "live-stream", "output",
                                          "fresh-randomness", "ambient", "rank-streams") if oracle in causes)
    return Prediction("mismatch", oracles, causes=tuple(deciding), why=tuple(why))
