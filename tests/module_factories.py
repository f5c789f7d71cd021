"""Factories for tests of `harness module`: good ones, and every kind of bad one."""

import torch

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
