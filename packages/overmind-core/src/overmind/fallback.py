"""How Overmind steps aside: one warning naming the cause and the fix, or an exception in strict mode.

``OVERMIND_STRICT=1`` turns every fallback into an error (tests, debugging); ``OVERMIND_DISABLE=1`` makes
``load`` a plain call.
"""
from __future__ import annotations

import os
import warnings


class OvermindWarning(UserWarning):
    """Overmind could not serve or publish a load; the plain loader's result was returned instead."""


class CacheBypassed(RuntimeError):
    """Raised instead of :class:`OvermindWarning` when ``OVERMIND_STRICT=1``."""


def strict() -> bool:
    return os.environ.get("OVERMIND_STRICT") == "1"


def disabled() -> bool:
    return os.environ.get("OVERMIND_DISABLE") == "1"


def step_aside(message: str, cause: BaseException | None = None, stacklevel: int = 3) -> None:
    """Warn once for this load (or raise under ``OVERMIND_STRICT=1``)."""
    if strict():
        raise CacheBypassed(message) from cause
    warnings.warn(OvermindWarning(message), stacklevel=stacklevel)
