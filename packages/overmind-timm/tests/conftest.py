"""Fixtures for the overmind-timm tests: tiny timm models (timm's own ``test_*`` architectures, a few hundred
thousand parameters) saved as the files a user passes.

timm imports torchvision; the torch build of the other lanes has no torchvision that imports on this project's
machines, so the tests that run timm are in the timm lane (``scripts/test --timm``) and skip elsewhere.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def _save_weights(folder: Path, seed: int, name: str = "test_vit", num_classes: int = 5) -> dict[str, Path]:
    """A ``name`` model built from ``seed``, saved as safetensors and as a torch checkpoint, and as a
    ``local-dir:`` folder (config.json and model.safetensors, as timm's save_for_hf writes them)."""
    import safetensors.torch
    import timm
    import torch
    from timm.models import _hub

    folder.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = timm.create_model(name, num_classes=num_classes)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, folder / "weights.safetensors")
    torch.save({"state_dict": state, "epoch": 3}, folder / "checkpoint.pth")
    _hub.save_for_hf(model, folder / "local", safe_serialization=True)
    return {"safetensors": folder / "weights.safetensors", "pth": folder / "checkpoint.pth", "local": folder / "local"}


@pytest.fixture(scope="session")
def save_weights():
    """``save_weights(folder, seed, name="test_vit", num_classes=5)``: the files of a model built from ``seed``."""
    return _save_weights


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> dict[str, Path]:
    return _save_weights(tmp_path_factory.mktemp("timm"), seed=11)
