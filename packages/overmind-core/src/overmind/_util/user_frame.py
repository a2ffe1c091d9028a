"""Warnings at the user's own line: the first frame outside Overmind, its adapters and the libraries they patch.

>>> warn_at_user_line(OvermindWarning("overmind: ..."))   # filename/lineno: the user's call, at any depth

So ``python -W error`` and warning filters by module work as they do for the library's own warnings. A leaf
module (nothing of overmind imported at load time): :mod:`.settings` and :mod:`.fallback` both use it.
"""
from __future__ import annotations

import sys
import warnings

from . import interrupts


class OvermindWarning(UserWarning):
    """Overmind could not serve or publish a load; the plain loader's result was returned instead."""


def warn_at_user_line(warning: Warning) -> None:
    """``warnings.warn(warning)`` attributed to the first frame outside Overmind, its adapters and the
    libraries they patched (the user's own line), whatever the depth of the call."""
    internal = _internal_packages()
    frame = sys._getframe(1)
    while frame.f_back is not None and _top_package(frame) in internal:
        frame = frame.f_back
    g = frame.f_globals
    warnings.warn_explicit(warning, type(warning), frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<unknown>"), registry=g.setdefault("__warningregistry__", {}))


# Packages whose frames are never the user's: ours, the standard library's machinery between a call and its
# callee, and (added at run time) the libraries whose loaders are patched.
_ALWAYS_INTERNAL = frozenset({"overmind", "importlib", "<frozen importlib", "contextlib", "functools", "pluggy",
                              "threading", "concurrent"})


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
    try:
        from ..adapters.patching import patched_targets

        patched = {_module_of(t.owner).partition(".")[0] for t in patched_targets()}
    except Exception as exc:  # noqa: BLE001 - attribution must never break a warning
        interrupts.raise_users(exc)
        patched = set()
    return _ALWAYS_INTERNAL | {p for p in patched if p and not p.startswith("__main__")}


def _module_of(owner) -> str:
    return getattr(owner, "__module__", None) or getattr(owner, "__name__", "") or ""
