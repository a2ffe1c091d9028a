"""How an adapter names itself in what it says: its label (the adapter, its distribution and the
library, each with its installed version) and its warnings.

>>> label("transformers")
'adapter transformers (overmind-transformers 0.1.0, transformers 5.24.0)'
"""
from __future__ import annotations

from functools import cache


@cache
def version_of(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    # what importlib.metadata finds, without its email parser (~2 ms a call)
    from .._util import distributions

    return distributions.version(dist) or "not installed"


def dist_of(adapter: str) -> str:
    """The distribution that ships adapter ``adapter``: ``overmind-<adapter>`` by convention."""
    return f"overmind-{adapter}"


def label(adapter: str, library: str | None = None) -> str:
    """``adapter transformers (overmind-transformers 0.1.0, transformers 5.24.0)``; the library is
    the adapter's namesake unless named."""
    dist, library = dist_of(adapter), library or adapter
    return f"adapter {adapter} ({dist} {version_of(dist)}, {library} {version_of(library)})"


class LazyLabel:
    """``label(adapter)`` for a debug record, read when the record is formatted: the versions it
    names are read from the installed metadata, and a debug record is mostly dropped (a spec this
    version does not define is collected again on each later module's import)."""

    __slots__ = ("adapter",)

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter

    def __str__(self) -> str:
        return label(self.adapter)


def warn(message: str, stacklevel: int = 3) -> None:
    """One :class:`overmind.OvermindWarning` (an error under ``OVERMIND_STRICT=1``)."""
    from .. import fallback

    fallback.step_aside(message, stacklevel=stacklevel + 1)
