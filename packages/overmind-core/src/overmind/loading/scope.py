"""Memos that last while a load runs (its nested loads included) and are dropped when no load is running: what a
reducer keeps for the length of a load (the tokenizer's split, reduced for its own entry and again in the
pipeline's).

A pipeline's tokenizer is reduced twice in one cold load: once for its own entry, and again inside the pipeline's
entry, and each reduce serialises and reparses its 49k-token vocabulary (docs/architecture.md, "Measured costs"). A
reducer keeps such work in :func:`memo` and reuses it only on an exact match that it checks itself (the tokenizer
compares the backend's whole serialised text): the scope decides nothing about what is cached or under which key, it
only bounds how long the memory is held. The memos are shared by all threads (the pickler runs on a helper thread),
and emptied when the last load in the process returns; outside a load :func:`memo` gives a fresh dict each time, so
nothing is kept.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

_lock = threading.Lock()
_active = 0
_memos: dict[str, dict[Any, Any]] = {}


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """The extent of one load; the memos are emptied when the last one in the process ends."""
    global _active
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                _memos.clear()


def memo(name: str) -> dict[Any, Any]:
    """The memo called ``name`` while a load runs, else a new empty dict (kept by no one)."""
    with _lock:
        if _active == 0:
            return {}
        return _memos.setdefault(name, {})


def active() -> bool:
    """Whether a load is running in this process (tests)."""
    return _active > 0
