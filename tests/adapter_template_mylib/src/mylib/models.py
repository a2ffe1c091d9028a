"""The models of the stand-in library and their two loaders."""
from __future__ import annotations

import json
import os

import torch

CONFIGS = {"tiny": {"hidden": 8, "classes": 3}, "wide": {"hidden": 16, "classes": 3}}


def locate(name: str) -> str:
    """The folder ``name`` is: itself where it is one, else ``$MYLIB_HOME/<name>``
    (``~/.cache/mylib/<name>`` without the variable)."""
    if os.path.isdir(name):
        return name
    home = os.environ.get("MYLIB_HOME") or os.path.expanduser("~/.cache/mylib")
    return os.path.join(home, name)


class Model(torch.nn.Module):
    """Two linear layers; ``config`` is what ``save_pretrained`` writes beside the weights."""

    def __init__(self, hidden: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.config = {"hidden": hidden, "classes": classes}
        self.body = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))

    @classmethod
    def from_pretrained(cls, name: str, dtype: torch.dtype | None = None) -> Model:
        """The model saved in folder ``name`` (see :func:`locate`): built at random from its
        config, then its weights loaded over the draws."""
        folder = locate(name)
        with open(os.path.join(folder, "config.json")) as f:
            model = cls(**json.load(f))
        model.load_state_dict(torch.load(os.path.join(folder, "weights.pt"), weights_only=True))
        return model.to(dtype) if dtype is not None else model

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f)
        torch.save(self.state_dict(), os.path.join(folder, "weights.pt"))


def create_model(name: str, pretrained: bool = False, checkpoint_path: str | None = None) -> Model:
    """A model of the registered configuration ``name``, built at random; ``pretrained``: its
    weights from ``locate(name)``; ``checkpoint_path``: from that file."""
    model = Model(**CONFIGS[name])
    path = os.path.join(locate(name), "weights.pt") if pretrained else checkpoint_path
    if path is not None:
        model.load_state_dict(torch.load(path, weights_only=True))
    return model
