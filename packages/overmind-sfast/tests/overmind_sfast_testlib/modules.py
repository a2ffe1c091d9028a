"""Tiny modules whose outputs are dataclasses, for the flattening tests.

They live in an importable module because TorchScript names a traced class after its module, and
the names pytest gives test files (``packages.overmind-sfast.tests...``) are not valid TorchScript
names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling


class Encoder(torch.nn.Module):
    """Returns a library's dataclass, as a CLIP text encoder does."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=h.sum(1))


@dataclass
class Pair:
    """A dataclass of the user's own, defined at module level."""

    a: torch.Tensor
    b: torch.Tensor


class PairModel(torch.nn.Module):
    def forward(self, x):
        return Pair(a=x + 1, b=x * 2)


class LocalModel(torch.nn.Module):
    """Returns a dataclass defined inside forward: no other process can import it."""

    def forward(self, x):
        @dataclass
        class Hidden:
            a: torch.Tensor

        return Hidden(a=x + 1)
