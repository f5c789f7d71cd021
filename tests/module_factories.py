"""Factories for tests of `harness module`: good ones, and every kind of bad one."""

import functools

import torch
import torch.utils.checkpoint

from harness.module_mode import ModelCase

BUILDS = []


def tuple_factory():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)), torch.rand(4, 8)


def keyword_factory():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, *, x):
            return self.drop(self.lin(x))

    return ModelCase(Net(), {"x": torch.rand(4, 8)})


def no_dropout_factory():
    """A model that draws no random numbers at all (dropout 0): nothing random to judge."""
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.0)), torch.rand(4, 8)


def raising_factory():
    raise RuntimeError("no weights here")


def wrong_factory():
    return "a model"


def nondeterministic_factory():
    BUILDS.append(1)
    layer = torch.nn.Linear(4, 4)
    with torch.no_grad():
        layer.weight.fill_(len(BUILDS))  # another value each build
    return layer, torch.rand(2, 4)


class Forked(torch.nn.Module):
    """Dropout inside a tracker stream of its own, as a model-parallel layer draws."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        with self.tracker.fork("layer-rng"):
            return self.drop(self.lin(x))


def tracker_factory(rng_tracker):
    rng_tracker.add("layer-rng", 77)
    return Forked(rng_tracker), torch.rand(4, 8)


class Counting(torch.nn.Module):
    """Its output changes with every call: a model no second run can reproduce."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * (1 + 0.125 * (self.calls % 3))


RUNS = []


def unreproducible_factory():
    module = Counting()
    RUNS.append(module)
    # every build starts its count where the previous build's left off: the second reference
    # run differs from the first
    module.calls = 5 * len(RUNS)
    return module, torch.rand(2, 4)


class _DrawsInBackward(torch.autograd.Function):
    """Identity whose backward draws (a seeded op with no submodule running): not a recompute's draw."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * (torch.rand_like(grad) >= 0)  # all ones: the gradient is unchanged


class DrawsInBackward(torch.nn.Module):
    def forward(self, x):
        return _DrawsInBackward.apply(x)


def backward_draw_factory():
    # torch's non-reentrant checkpoint stops its recompute early, inside the last dropout's
    # forward; the draw in backward comes after that recompute.
    layers = torch.nn.Sequential(DrawsInBackward(), torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                                 torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    return layers, torch.rand(4, 8)


class Embedded(torch.nn.Module):
    """Token ids in, as a language model takes them: nothing of the input can require grad."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, ids):
        return self.drop(self.embed(ids))


def token_ids_factory():
    return Embedded(), torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(2))


class Masked(torch.nn.Module):
    """A submodule called with a keyword argument (a mask), as transformer blocks are."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, mask=None):
        return self.drop(self.lin(x)) * mask


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Masked()
        self.register_buffer("mask", (torch.arange(8) % 3 != 0).float())

    def forward(self, x):
        return self.inner(x, mask=self.mask)


def masked_factory():
    return Outer(), torch.rand(4, 8)


def never_checkpointing(checkpointing=False):
    """Takes `checkpointing` and ignores it: a model whose checkpointing never runs."""
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)), torch.rand(4, 8)


class RaisesInForward(torch.nn.Module):
    def forward(self, x):
        raise ValueError("this model raises")


def raising_forward_factory():
    return RaisesInForward(), torch.rand(2, 2)


class ForwardCheckpointingLayer(torch.nn.Module):
    """As transformers 5.23's ``GradientCheckpointingLayer``: each subclass's ``forward`` is wrapped
    at class level, and with ``gradient_checkpointing`` on it checkpoints the class's own forward
    function through the instance's ``_gradient_checkpointing_func``, so a recompute calls that
    function directly, never the instance's ``forward``."""

    gradient_checkpointing = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        forward = cls.forward

        @functools.wraps(forward)
        def forward_with_checkpointing(self, *args, **kwargs):
            if self.gradient_checkpointing and self.training:
                return self._gradient_checkpointing_func(functools.partial(forward, self, **kwargs), *args)
            return forward(self, *args, **kwargs)

        cls.forward = forward_with_checkpointing


class DrawingLayer(ForwardCheckpointingLayer):
    """A dropout of the layer's own (no submodule runs it), then a linear layer and its dropout."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, scale=1.0):
        return self.drop(self.lin(torch.nn.functional.dropout(x, 0.5, self.training))) * scale


class FunctionCheckpointed(torch.nn.Module):
    def __init__(self, checkpointing, preserve_rng_state):
        super().__init__()
        self.layers = torch.nn.ModuleList([DrawingLayer() for _ in range(2)])
        for layer in self.layers:  # as transformers' _set_gradient_checkpointing does
            layer.gradient_checkpointing = checkpointing
            layer._gradient_checkpointing_func = functools.partial(
                torch.utils.checkpoint.checkpoint, use_reentrant=False, preserve_rng_state=preserve_rng_state)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=2.0)
        return x


def function_checkpointing(checkpointing=False):
    """Layers that checkpoint their class's forward function (transformers 5.23's way)."""
    return FunctionCheckpointed(checkpointing, True), torch.rand(4, 8)


def function_checkpointing_no_rng_state(checkpointing=False):
    """The same with ``preserve_rng_state=False``: the recompute redraws the layer's own dropout wrong."""
    return FunctionCheckpointed(checkpointing, False), torch.rand(4, 8)
