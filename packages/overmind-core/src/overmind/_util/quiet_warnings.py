"""Warnings raised inside Overmind's own work are dropped, in the thread doing that work and nowhere else: an
"ignore" filter at the front of ``warnings.filters`` whose category matches per thread (not ``catch_warnings``,
which swaps every thread's filters and makes every registry forget what it showed).

Pickling a result and rebuilding it run library code that a plain call never runs (torch's reduce and rebuild
functions, which warn that ``TypedStorage`` is deprecated, that sparse or quantized tensors are in beta), so a
warning raised there is no warning of the call's. ``warnings.catch_warnings`` cannot drop them: it swaps the
filters of every thread (another thread's warning is lost meanwhile, or the swap undone under it), and it bumps
the filters' version, which makes every module's ``__warningregistry__`` forget what it already showed (a
"default" warning shows a second time).

Instead, while a thread is inside :class:`quiet`, an "ignore" filter sits at the front of ``warnings.filters``
whose category matches only the warnings of a thread inside it (its metaclass answers ``issubclass`` per thread;
the recording filter of ``loading/replay/loader_warnings.py`` does the same). "ignore" writes no registry, so the
process's registries stay as plain leaves them; and no filter of the user's ("error" included) is reached from
inside, so Overmind's own work never raises a warning as an error. Nothing else changes: another thread's
warnings, and the loader's own (which never runs inside), meet the user's filters as before. The filter leaves
the list when the last thread leaves :class:`quiet`; one an interrupt left behind matches nothing and leaves at
the next exit.
"""
from __future__ import annotations

import threading
import warnings

_depth: dict[int, int] = {}  # thread ident -> how many quiet blocks it is inside
_lock = threading.Lock()


class _InsideQuiet(type):
    def __subclasscheck__(cls, sub: type) -> bool:
        return threading.get_ident() in _depth


class OwnWork(Warning, metaclass=_InsideQuiet):
    """The category of the front filter: every warning of a thread inside :class:`quiet`."""


FILTER = ("ignore", None, OwnWork, None, 0)


def active() -> bool:
    """Whether this thread is inside :class:`quiet`."""
    return threading.get_ident() in _depth


class quiet:  # noqa: N801 (used as a function: ``with quiet():``)
    """``with quiet():`` drops every warning this thread raises inside the block; nests."""

    __slots__ = ()

    def __enter__(self) -> None:
        ident = threading.get_ident()
        with _lock:
            _to_front()
            _depth[ident] = _depth.get(ident, 0) + 1  # last: an interrupt before it leaves no thread marked

    def __exit__(self, *exc: object) -> None:
        ident = threading.get_ident()
        with _lock:
            left = _depth.pop(ident, 1) - 1
            if left:
                _depth[ident] = left
            elif not _depth:
                _remove()


def _to_front() -> None:
    filters = warnings.filters
    if filters and filters[0] is FILTER:
        return
    _remove()
    filters.insert(0, FILTER)  # type: ignore[attr-defined]  # a list (typeshed says Sequence)


def _remove() -> None:
    filters = warnings.filters
    while FILTER in filters:
        filters.remove(FILTER)  # type: ignore[attr-defined]
