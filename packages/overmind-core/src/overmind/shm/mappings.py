"""The registry of this process's live entry mappings, to recognise a storage that already lives in one.

File entries (checkpoint files, see :mod:`.filemaps`) are registered too: a storage of a file-backed hit is
located at its offset in the file, and the next entry holding it references the same file entry.

A storage found here is referenced by the next entry that contains it instead of being copied again
(``from_pretrained(..., vae=vae)``), but only while its pages are pristine: a page the user wrote to
became a private anonymous page, and its bytes are no longer the entry's. /proc/self/pagemap tells
(bit 61: file or shared page, see :mod:`.pagemap`); where pagemap cannot be read, the storage is copied, never
referenced.
"""
from __future__ import annotations

import bisect
import threading
import weakref
from typing import TYPE_CHECKING, NamedTuple

from .pagemap import is_pristine

if TYPE_CHECKING:
    from .pagemap import PageSnapshot
    from .reader import EntryMapping, FileMapping

_lock = threading.Lock()
_starts: list[int] = []
_spans: dict[int, tuple[int, str, object]] = {}  # data start -> (end, entry_id, token)


class Location(NamedTuple):
    entry_id: str
    offset: int  # relative to the entry's data region


def register(m: EntryMapping | FileMapping) -> None:
    """Record ``m``'s data region (a file entry's: the whole file, offsets in the file) until its mmap is freed
    (the storages over it keep the mmap alive, possibly long after the mapping object itself is gone)."""
    start, end, token = m.data_address, m.address + len(m.mm), object()
    if end <= start:
        # No data (a skeleton-only entry): nothing to locate, and its empty region would start where the next
        # mapping starts, which for a file entry (data at offset 0) is that entry's own key here.
        return
    with _lock:
        if start not in _spans:
            bisect.insort(_starts, start)
        _spans[start] = (end, m.entry_id, token)
    weakref.finalize(m.mm, _unregister, start, token)


def _unregister(start: int, token: object) -> None:
    with _lock:
        span = _spans.get(start)
        if span is None or span[2] is not token:
            return  # the address was reused by a newer mapping
        del _spans[start]
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i]


def live_count() -> int:
    with _lock:
        return len(_spans)


def contains(ptr: int) -> bool:
    """Whether ``ptr`` lies in a live entry mapping of this process."""
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        return i >= 0 and ptr < _spans[_starts[i]][0]


def locate(ptr: int, nbytes: int, pages: PageSnapshot | None = None) -> Location | None:
    """Where ``[ptr, ptr+nbytes)`` lives, if inside a live mapping whose pages there are untouched (asked of
    ``pages``, an encode's snapshot, when given; else read now)."""
    if nbytes == 0 or ptr == 0:
        return None
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i < 0:
            return None
        start = _starts[i]
        end, entry_id, _ = _spans[start]
    if ptr + nbytes > end or not (pages.pristine(ptr, nbytes) if pages is not None else is_pristine(ptr, nbytes)):
        return None
    return Location(entry_id, ptr - start)
