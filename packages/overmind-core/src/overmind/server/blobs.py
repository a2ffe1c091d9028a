"""The server's index of stored bytes, for a publisher's dedup: which entries hold a storage of this size and
sampled hash (blob key), and where; and the pages an entry with holes really holds.

A publish names, for each storage of 64 KiB or more that its memfd really holds, a blob key
(``"<nbytes>:<sampled hash>"``, see :mod:`overmind.entries.dedup`) and its offset in the data region. A later ``blobs``
request asks which entries hold candidates for its keys; the client byte-compares each candidate before
referencing it, so the index is only ever a hint: a wrong or colliding key costs a failed compare, never a
wrong object. The server never reads the bytes itself.

Entries leave the index when they are freed (evicted, marked bad and unreferenced, server shutdown).

>>> index = BlobIndex()
>>> index.add("e-1", [["4096:ab12", 0]])
>>> index.find(["4096:ab12", "8:00"])      # [(request position, entry_id, offset), ...]
[(0, 'e-1', 0)]
"""
from __future__ import annotations

import os
import re

from ..errors import OvermindError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# How many holders one key answers with: a second one is there only when two loaders wrote the same bytes
# concurrently (or with dedup off); more would be a key shared by different bytes, each costing a compare.
MAX_CANDIDATES = 4
# A publish or a lookup names at most this many keys (a model has hundreds of storages; a frame is 1 MiB).
MAX_KEYS = 8192
_KEY = re.compile(r"^[0-9]{1,20}:[0-9a-f]{8,128}$")


class BadBlobs(OvermindError, ValueError):
    """A publish's or lookup's blob list is not of the documented shape."""


def parse_held(raw: Any) -> list[tuple[str, int]]:
    """A publish's ``blobs`` (``[[key, offset], ...]``) checked for shape; raises :class:`BadBlobs`."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_KEYS:
        raise BadBlobs(f"'blobs' must be a list of at most {MAX_KEYS} [key, offset] pairs")
    held = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _KEY.match(item[0])
                and isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 0):
            raise BadBlobs(f"'blobs' items must be [\"<nbytes>:<hex>\", offset], got {item!r:.80}")
        held.append((item[0], item[1]))
    return held


def parse_keys(raw: Any) -> list[str]:
    """A lookup's ``keys`` checked for shape; raises :class:`BadBlobs`."""
    if not isinstance(raw, list) or len(raw) > MAX_KEYS or not all(isinstance(k, str) and _KEY.match(k) for k in raw):
        raise BadBlobs(f"'keys' must be a list of at most {MAX_KEYS} blob keys \"<nbytes>:<hex>\"")
    return raw


class BlobIndex:
    """Blob key -> the entries holding such bytes (oldest first), and each entry's keys (to forget them)."""

    def __init__(self) -> None:
        self._holders: dict[str, list[tuple[str, int]]] = {}
        self._by_entry: dict[str, list[tuple[str, int]]] = {}

    def add(self, entry_id: str, held: list[tuple[str, int]] | list[list]) -> None:
        """Record that ``entry_id``'s data region holds each ``(key, offset)``."""
        pairs = [(str(k), int(o)) for k, o in held]
        if not pairs:
            return
        self._by_entry[entry_id] = pairs
        for key, offset in pairs:
            self._holders.setdefault(key, []).append((entry_id, offset))

    def remove(self, entry_id: str) -> None:
        """Forget ``entry_id`` (it is being freed)."""
        for key, _ in self._by_entry.pop(entry_id, ()):
            holders = [h for h in self._holders.get(key, ()) if h[0] != entry_id]
            if holders:
                self._holders[key] = holders
            else:
                self._holders.pop(key, None)

    def find(self, keys: list[str]) -> list[tuple[int, str, int]]:
        """``(position in keys, entry_id, offset)`` for up to :data:`MAX_CANDIDATES` holders of each key."""
        found = []
        for i, key in enumerate(keys):
            for entry_id, offset in self._holders.get(key, ())[:MAX_CANDIDATES]:
                found.append((i, entry_id, offset))
        return found

    def __len__(self) -> int:
        """How many distinct keys are indexed."""
        return len(self._holders)

    def entries(self) -> int:
        """How many entries have keys in the index."""
        return len(self._by_entry)


def held_bytes(fd: int, size: int) -> int:
    """The memory ``fd`` (a sealed memfd of ``size`` bytes) really uses: an entry whose storages were found
    elsewhere leaves holes, which tmpfs does not back with pages (``st_blocks``)."""
    try:
        blocks = os.fstat(fd).st_blocks
    except (OSError, AttributeError):
        return size
    return min(size, blocks * 512)
