"""How this adapter names itself in warnings, and the marker that makes one call uncacheable.

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


class Uncacheable:
    """An argument stand-in that no cache key can be made of: the core then calls the loader directly.

    Put into ``arguments`` by ``overmind_key_parts`` when a call must not be cached (its input cannot be
    identified cheaply, or the adapter failed to understand it). ``reason`` shows in the core's debug log.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"<uncacheable: {self.reason}>"


def mark_uncacheable(arguments: dict, reason: str) -> None:
    """Make the load with ``arguments`` run without the cache (see :class:`Uncacheable`)."""
    arguments["__overmind_uncacheable__"] = Uncacheable(reason)
