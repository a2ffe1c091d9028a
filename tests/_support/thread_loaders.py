"""A loader slow enough for threads to race it (tests of one first load per process)."""
from __future__ import annotations

import time

import torch

from overmind.testing import record_call


def slow_build(n: int) -> torch.Tensor:
    record_call(n)
    time.sleep(0.5)
    return torch.full((n,), 2.0)
