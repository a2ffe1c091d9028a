"""Loaders that draw from the global random generators, for fresh-process tests (importable by name, so every
process keys them alike).

``load_net`` is the plain PyTorch pattern: build the network (its layers initialised at random), then overwrite the
weights from a checkpoint. ``load_net_with_new_head`` loads a checkpoint that lacks a layer, which stays as drawn.
"""
from __future__ import annotations

import torch

from overmind.testing import record_call


class Net(torch.nn.Module):
    def __init__(self, head: bool = False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)
        if head:
            self.head = torch.nn.Linear(4, 2)


def save_net(path: str, seed: int = 0) -> str:
    torch.manual_seed(seed)
    torch.save(Net().state_dict(), path)
    return path


def load_net(path: str) -> Net:
    record_call(path)
    net = Net()
    net.load_state_dict(torch.load(path))
    return net.eval()


def load_net_with_new_head(path: str) -> Net:
    record_call(path)
    net = Net(head=True)
    net.load_state_dict(torch.load(path), strict=False)
    return net.eval()


def load_net_seeded_inside(path: str) -> Net:
    """Seeds torch's generator itself, then builds and loads: the process is seeded afterwards."""
    record_call(path)
    torch.manual_seed(0)
    net = Net()
    net.load_state_dict(torch.load(path))
    return net.eval()
