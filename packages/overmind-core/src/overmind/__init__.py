"""Overmind: load a model once per machine, then map it, zero-copy, into every process that asks.

>>> import overmind
>>> overmind.activate()                      # patch the installed adapters' loaders
>>> model = overmind.load(torch.load, path)  # or cache any loader call directly

This module imports nothing heavy: the server process imports the ``overmind`` package and must never
import torch. The public functions import their machinery on first use.
"""
from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["load", "activate", "deactivate", "hookimpl", "__version__"]


def load(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Return ``fn(*args, **kwargs)``, served from the machine-wide cache when possible.

    The first call on this machine runs ``fn`` and publishes the result; later calls, in this or any other
    process of the same user, get an equal, independent object whose tensors are mapped copy-on-write from
    shared memory. Any failure of the cache gives the plain result with one warning.

    >>> unet = overmind.load(UNet2DConditionModel.from_pretrained, ckpt, subfolder="unet")
    """
    from .api import load as _load

    return _load(fn, *args, **kwargs)


def activate(*, strict: bool = False) -> list[str]:
    """Discover the installed adapters (entry points ``overmind.adapters``) and patch their loaders.

    Returns the names of the active adapters. Idempotent. An adapter that fails to import or patch is
    skipped with one warning, or raises with ``strict=True``.
    """
    from .activation import activate as _activate

    return _activate(strict=strict)


def deactivate() -> None:
    """Restore every patched attribute to its exact original object."""
    from .activation import deactivate as _deactivate

    _deactivate()


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        from .hookspecs import hookimpl

        return hookimpl
    raise AttributeError(f"module 'overmind' has no attribute {name!r}")
