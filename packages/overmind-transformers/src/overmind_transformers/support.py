"""How this adapter names itself in warnings, and how a key hook leaves one call uncached.

Every warning names the adapter, its version, the library and the library's version, so a report of
``overmind: adapter transformers (overmind-transformers 0.1.0, transformers 5.24.0) cannot patch ...`` says
what moved where without a follow-up question.
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from importlib import metadata

ADAPTER_DISTS = {"transformers": "overmind-transformers", "diffusers": "overmind-diffusers"}


@lru_cache(maxsize=None)
def version_of(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def label(adapter: str) -> str:
    """``adapter transformers (overmind-transformers 0.1.0, transformers 5.24.0)``; the library is the adapter's
    namesake."""
    dist = ADAPTER_DISTS.get(adapter, f"overmind-{adapter}")
    return f"adapter {adapter} ({dist} {version_of(dist)}, {adapter} {version_of(adapter)})"


def warn(message: str, stacklevel: int = 3) -> None:
    """One :class:`overmind.fallback.OvermindWarning` (an error under ``OVERMIND_STRICT=1``)."""
    from overmind import fallback

    fallback.step_aside(message, stacklevel=stacklevel + 1)


def uncacheable(reason: str) -> Exception:
    """The exception an ``overmind_key_parts`` hook raises to leave one call uncached (the loader runs directly,
    debug log only): ``raise uncacheable("a state dict, not a file")``."""
    from overmind.key import Unkeyable

    return Unkeyable(reason)
