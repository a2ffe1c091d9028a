"""Warnings at the user's own line: the first frame outside Overmind, its adapters and the libraries they patch
(:func:`warn_at_user_line`; :func:`count_patched`, told by patching).

>>> warn_at_user_line(OvermindWarning("overmind: ..."))   # filename/lineno: the user's call, at any depth

So ``python -W error`` and warning filters by module work as they do for the library's own warnings. A leaf
module: :mod:`overmind.settings` and :mod:`overmind.fallback` use it, and :mod:`overmind.adapters.patching` tells
it which packages hold patched loaders.
"""
from __future__ import annotations

import sys


class OvermindWarning(UserWarning):
    """Overmind could not serve or publish a load; the plain loader's result was returned instead."""


def warn_at_user_line(warning: Warning) -> None:
    """``warnings.warn(warning)`` attributed to the first frame outside Overmind, its adapters and the
    libraries they patched (the user's own line), whatever the depth of the call."""
    import warnings  # here: ``overmind`` exports OvermindWarning, and overmind run's launcher imports none

    internal = _internal_packages()
    frame = sys._getframe(1)
    while frame.f_back is not None and _top_package(frame) in internal:
        frame = frame.f_back
    g = frame.f_globals
    warnings.warn_explicit(warning, type(warning), frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<unknown>"), registry=g.setdefault("__warningregistry__", {}))


# Packages whose frames are never the user's: ours, and the standard library's machinery between a call and its
# callee. The libraries whose loaders are patched are added while they are (:func:`count_patched`).
_ALWAYS_INTERNAL = frozenset({"overmind", "importlib", "<frozen importlib", "contextlib", "functools", "pluggy",
                              "threading", "concurrent"})
_patched: dict[str, int] = {}  # top-level package -> how many of its attributes are patched now


def count_patched(owner: object, delta: int) -> None:
    """One more (``delta=1``) or one fewer (``-1``) attribute of ``owner`` (a class or module) patched: the frames
    of a package holding a patched loader are not the user's. :mod:`overmind.adapters.patching` calls it."""
    package = _module_of(owner).partition(".")[0]
    if not package or package.startswith("__main__"):
        return
    left = _patched.get(package, 0) + delta
    if left > 0:
        _patched[package] = left
    else:
        _patched.pop(package, None)


def is_overmind(frame) -> bool:
    """Whether ``frame`` runs Overmind's code (the core or an ``overmind_*`` adapter)."""
    return _top_package(frame) == "overmind"


def _top_package(frame) -> str:
    name = frame.f_globals.get("__name__") or ""
    if not name or name == "__main__":
        filename = frame.f_code.co_filename
        return "<frozen importlib" if filename.startswith("<frozen importlib") else name
    top = name.partition(".")[0]
    return "overmind" if top.startswith("overmind_") else top


def _internal_packages() -> frozenset:
    return _ALWAYS_INTERNAL | set(_patched)


def _module_of(owner) -> str:
    return getattr(owner, "__module__", None) or getattr(owner, "__name__", "") or ""
