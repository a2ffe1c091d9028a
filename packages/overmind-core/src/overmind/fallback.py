"""How Overmind steps aside: one warning naming the cause and the fix, or an exception in strict mode.

``OVERMIND_STRICT=1`` turns every fallback into an error (tests, debugging); ``OVERMIND_DISABLE=1`` makes
``load`` a plain call. One user call warns once: a load nested in another (a pipeline loading its
components) that could not be cached warns, and the outer load failing for the same cause does not warn again
(:class:`LoaderRun`).
"""
from __future__ import annotations

import logging
import os
import threading
import warnings

from .errors import OvermindError, ServerError

log = logging.getLogger("overmind")
_local = threading.local()


class OvermindWarning(UserWarning):
    """Overmind could not serve or publish a load; the plain loader's result was returned instead."""


class CacheBypassed(OvermindError, RuntimeError):
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


def fix_for(e: BaseException) -> str:
    """The advice a "could not cache" warning ends with; empty where the error's own message already says
    what to do (an exception with ``has_fix``, such as every ``PicklingFailed``; the server's budget refusal,
    which names ``OVERMIND_MAX_BYTES`` and ``overmind evict``)."""
    if getattr(e, "has_fix", False):
        return ""
    if isinstance(e, ServerError) and e.reason == "budget":
        return ""
    return " Run 'overmind doctor'."


class LoaderRun:
    """One loader run under this thread's claim, for the one-warning-per-user-call rule.

    >>> run = LoaderRun(outermost=not stack)
    >>> result = fn(*args, **kwargs)     # nested loads may warn meanwhile
    >>> run.finished()
    >>> run.not_cached(loader.name, e)   # warns, unless a nested load already warned about type(e)
    """

    def __init__(self, outermost: bool) -> None:
        if outermost or getattr(_local, "causes", None) is None:
            _local.causes = set()  # exception types this thread's loads warned about in this user call
        self._causes: set = _local.causes
        self._before = set(self._causes)
        self._inner: set = set()

    def finished(self) -> None:
        """The loader returned: the causes its nested loads warned about are now known."""
        self._inner = self._causes - self._before

    def not_cached(self, name: str, cause: Exception) -> None:
        """Say that ``name``'s result could not be cached because of ``cause`` (or raise when strict)."""
        if type(cause) in self._inner and not strict():
            log.debug("overmind: not caching %s either: %s", name, cause)
            return
        self._causes.add(type(cause))
        # stacklevel 4: the warning points where the user's call entered Overmind, as every other fallback.
        step_aside(f"overmind: could not cache {name} ({type(cause).__name__}: {cause}); returned the plain "
                   f"result.{fix_for(cause)}", cause, stacklevel=4)
