"""The network of the ``pytorch-net`` scenario (``pytorch_net.py``), importable by name so that every process keys
its loader alike, and its checkpoint (``python benchmarks/scenarios/net_model.py DIR`` writes ``DIR/net.pt``)."""
import os
import sys

import torch

LAYERS, WIDTH = 24, 2048


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def load_net(path: str) -> Net:
    net = Net()
    net.load_state_dict(torch.load(path))
    return net.eval()


def save(folder: str) -> str:
    path = os.path.join(folder, "net.pt")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        torch.manual_seed(0)
        torch.save(Net().state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


if __name__ == "__main__":
    print(save(sys.argv[1]))
