"""The axes of a case and the values each takes, as plain enums (no torch): the model builds
cases from them, and a record's axis columns hold their values (the report orders its matrices by
them without loading the model).  `AXES` maps each axis name to its enum, in column order
(`results.AXES` holds the same names; a test ties them)."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """Checkpoint flavour (``use_reentrant=True/False`` in PyTorch terms)."""

    REENTRANT = "reentrant"
    NONREENTRANT = "nonreentrant"


class Layout(enum.Enum):
    """Which RNG streams the sites of a region draw from."""

    DEFAULT = "default"  # all sites on the default generator, tracker present but unused by sites
    TRACKED = "tracked"  # all sites inside tracker.fork(name)
    MIXED = "mixed"  # sites alternate default and tracked
    SHARED = "shared"  # two tracker names alias one generator state; sites alternate the names
    UNTRACKED = "untracked"  # no tracker at all; sites on the default generator


class Capture(enum.Enum):
    """How the workload is executed: eagerly or inside CUDA graphs."""

    EAGER = "eager"
    SEPARATE = "separate"  # forward graph + backward graph, replayed in order
    SINGLE = "single"  # forward and backward captured in one graph


class Nesting(enum.Enum):
    """How checkpointed regions are arranged."""

    FLAT = "flat"  # one region
    NESTED = "nested"  # a region inside a region
    SIBLINGS = "siblings"  # two regions one after the other
    DEEP = "deep"  # three levels: a region inside a region inside a region
    WIDE = "wide"  # three regions one after the other: three recomputes pending at once


class Interleave(enum.Enum):
    """What happens between forward and backward."""

    NONE = "none"
    DRAWS = "draws"  # draw from every live stream, as other micro-batches would


class Device(enum.Enum):
    """The device type the workload runs on."""

    CPU = "cpu"
    CUDA = "cuda"


class Op(enum.Enum):
    """The RNG consumers of `harness.model.ops` (one registry entry each)."""

    NATIVE_DROPOUT = "native_dropout"
    DROPOUT = "dropout"
    DROPOUT_INPLACE = "dropout_inplace"
    BERNOULLI = "bernoulli_"
    RAND = "rand"
    RANDN = "randn"
    RAND_LIKE = "rand_like"
    RANDN_LIKE = "randn_like"
    RANDINT = "randint"
    NORMAL = "normal_"
    UNIFORM = "uniform_"
    MULTINOMIAL = "multinomial"
    RANDPERM = "randperm"
    POISSON = "poisson"
    EXPONENTIAL = "exponential_"
    SDPA_MATH = "sdpa_math"
    SDPA_EFFICIENT = "sdpa_efficient"
    SDPA_FLASH = "sdpa_flash"
    SDPA_CUDNN = "sdpa_cudnn"
    NODRAW = "nodraw"
    DROPOUT_P0 = "dropout_p0"
    # Attention without dropout on whatever backend the SDPA flags let torch choose: it draws
    # nothing, and its output shows a checkpoint that leaves the flags changed (issue 29).
    SDPA_AUTO = "sdpa_auto"


class Dtype(enum.Enum):
    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"


class Shape(enum.Enum):
    SMALL = "small"
    ODD = "odd"
    LARGE = "large"


class Passing(enum.Enum):
    """How a region's input reaches it, or the context the region is entered under."""

    POSITIONAL = "positional"
    KEYWORD = "keyword"
    CLOSURE = "closure"
    LIST = "list"
    DICT = "dict"
    AUTOCAST = "autocast"
    SDPA_KERNEL = "sdpa_kernel"
    TWICE = "twice"  # the same tensor passed as two arguments (the region reads their mean)


AXES: dict[str, type[enum.Enum]] = {
    "mode": Mode,
    "layout": Layout,
    "capture": Capture,
    "nesting": Nesting,
    "interleave": Interleave,
    "device": Device,
    "op": Op,
    "dtype": Dtype,
    "shape": Shape,
    "passing": Passing,
}
