"""The portable keys (``keys/portable.py``) of the entries this process knows by their local key: an
object rebuilt from an entry and passed to a later load is keyed by its entry (``("entry", key)``,
:mod:`.provenance`), and inside a portable key by that entry's portable key, so a pipeline built
from components of earlier loads means the same on every node. An entry whose portable key this
process does not know is described by content there instead.
"""
from __future__ import annotations

import threading

MAX_REMEMBERED = 4096
_lock = threading.Lock()
_portable: dict[str, str] = {}  # local key -> portable key, oldest first


def remember(local_key: str, portable_key: str) -> None:
    """``local_key``'s entry has ``portable_key`` (published with it, imported by it, or hit)."""
    with _lock:
        _portable.pop(local_key, None)
        if len(_portable) >= MAX_REMEMBERED:
            del _portable[next(iter(_portable))]
        _portable[local_key] = portable_key


def portable_of(local_key: str) -> str | None:
    """The portable key of ``local_key``'s entry, if this process knows it."""
    return _portable.get(local_key)
