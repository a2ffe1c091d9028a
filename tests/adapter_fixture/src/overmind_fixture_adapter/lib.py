"""A stand-in model library: a loader classmethod, a sibling subclass, an object plain pickle rejects."""
from __future__ import annotations

import os
import threading

import torch


class Handle:
    """Holds a lock (plain pickle refuses it); the adapter's reducer keeps only the name."""

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()


class Model(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, handle: Handle):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.handle = handle

    @classmethod
    def from_pretrained(cls, path: str, scale: float = 1.0, head: int = 0) -> Model:
        """Reads a tensor saved with torch.save; appends a line to $FIXTURE_LOAD_LOG per real load. ``head``: also
        a head of that many values drawn from torch's global generator (a loader that initialises at random)."""
        log = os.environ.get("FIXTURE_LOAD_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{cls.__name__} {os.getpid()}\n")
        model = cls(torch.load(path) * scale, Handle(os.path.basename(path)))
        if head:
            model.head = torch.nn.Parameter(torch.randn(head))
        return model


class SpecialModel(Model):
    """A sibling sharing the inherited ``from_pretrained``: a different loader, a different entry."""
