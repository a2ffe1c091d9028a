"""Loaders the GPU tests (tests/test_gpu.py) call in fresh processes: importable by name, so every process keys
them alike."""
from __future__ import annotations

import torch


def mixed_module(units: int = 4096):
    """A module of plain fp16 parameters and buffers of mixed sizes (values i % 251), on the CPU."""
    module = torch.nn.Module()
    for i in range(40):
        n = ((i % 7) + 1) * units
        t = torch.arange(n, dtype=torch.int32).remainder_(251 - i).to(torch.float16)
        if i % 5 == 4:
            module.register_buffer(f"b{i}", t)
        else:
            module.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=i % 2 == 0))
    return module


def cuda_module():
    """The same module built on cuda:0, as a loader that calls ``.to("cuda")`` leaves it."""
    return mixed_module().to("cuda:0")
