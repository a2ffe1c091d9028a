"""The TorchScript models of ``test_torchscript.py``, in a module of their own.

TorchScript names a class after its Python module. Under pytest's importlib import mode a test file's module is
``packages.overmind-core.tests.test_torchscript``, with a ``-``. The compiled import (``overmind.native._C``) refuses
such a name ("Found character '45'") when it compiles a traced archive's classes in a process that has not compiled
them already, where ``torch.jit.load`` (the twin) accepts it: a known difference of the compiled import.
Whether a test process has compiled them depends on the order the tests run in, which differs under pytest-xdist;
the name ``_support.script_models`` keeps the tests about what they test.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.register_buffer("shift", torch.linspace(-1, 1, width))
        self.scale = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x) * self.scale + self.shift)


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(3)])
        self.head = nn.Linear(width, 4, bias=False)
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x) + self.steps.sum()


class WithConstant(nn.Module):
    """Tracing captures the tensor made in forward as a constant: a record of the constants pickle."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.arange(16, dtype=torch.float32)


EXAMPLE = torch.randn(2, 16, generator=torch.Generator().manual_seed(7))


def scripted() -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    return torch.jit.script(Net()).eval()


def traced() -> torch.jit.ScriptModule:
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarning about the captured constant, which is the point
        return torch.jit.trace(nn.Sequential(WithConstant(), Net()).eval(), EXAMPLE)


MODELS = {"scripted": scripted, "traced": traced}
