"""Loaders that change a module they are given, as PEFT's ``PeftModel.from_pretrained(base, lora)`` changes
``base``, for fresh-process tests (importable by name, so every process keys them alike)."""
from __future__ import annotations

import torch

from overmind.testing import record_call


class Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x))


class Scaled(torch.nn.Module):
    """A layer that holds the module it replaces (as a LoRA layer holds its base layer)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.scale = torch.nn.Parameter(torch.empty(4).normal_())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.scale


class Adapted(torch.nn.Module):
    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x)


def double_output(module, inputs, output):
    return output * 2


def save(path: str) -> str:
    torch.manual_seed(0)
    torch.save({"base": Base().state_dict(), "scale": torch.arange(4.0)}, path)
    return path


def build_base(path: str) -> Base:
    base = Base()
    base.load_state_dict(torch.load(path)["base"])
    return base


def adapt(base: Base, path: str) -> Adapted:
    """Swaps ``base.fc`` for a layer that holds it, freezes the head, adds an attribute and a forward hook."""
    record_call(path, "argument_loaders")
    base.fc = Scaled(base.fc)
    with torch.no_grad():
        base.fc.scale.copy_(torch.load(path)["scale"])
    base.head.requires_grad_(False)
    base.adapted_by = "adapt"
    base.head.register_forward_hook(double_output)
    return Adapted(base)


def scale_in_place(base: Base, path: str) -> Adapted:
    """Changes the values of a tensor of ``base``: a hit cannot do that to the caller's module."""
    record_call(path, "argument_loaders")
    with torch.no_grad():
        base.fc.weight.mul_(2)
    return Adapted(base)
