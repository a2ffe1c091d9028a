"""The registry of this process's live entry mappings, file entries' included, to recognise a storage that already
lives in one.

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
    import mmap

    from .pagemap import PageSnapshot

_lock = threading.Lock()
_starts: list[int] = []
# data start -> (end, entry_id, a weak reference to the mmap). No callback: Overmind runs no Python code when
# an object of the user's dies, where a signal handler's exception would be lost (``_util/interrupts.py``); the spans
# of mmaps that are gone are dropped when next met.
_spans: dict[int, tuple[int, str, weakref.ref]] = {}


class Location(NamedTuple):
    entry_id: str
    offset: int  # relative to the entry's data region


def register(entry_id: str, start: int, end: int, mm: mmap.mmap) -> None:
    """Record that entry ``entry_id``'s data lies at ``[start, end)`` (a file entry's: the whole file, offsets in
    the file) in ``mm``, until ``mm`` is freed (the storages over it keep it alive, possibly long after the mapping
    object that made it is gone)."""
    if end <= start:
        # No data (a skeleton-only entry): nothing to locate, and its empty region would start where the next
        # mapping starts, which for a file entry (data at offset 0) is that entry's own key here.
        return
    with _lock:
        _drop_dead()
        if start not in _spans:
            bisect.insort(_starts, start)
        _spans[start] = (end, entry_id, weakref.ref(mm))


def _drop_dead() -> None:
    """Forget the spans whose mmap is gone (the caller holds ``_lock``)."""
    for start in [s for s, (_, _, ref) in _spans.items() if ref() is None]:
        _forget(start)


def _forget(start: int) -> None:
    del _spans[start]
    del _starts[bisect.bisect_left(_starts, start)]


def _live_span(ptr: int) -> tuple[int, int, str] | None:
    """The live mapping's (start, end, entry_id) that holds ``ptr`` (the caller holds ``_lock``). Live mappings
    never overlap, so the first live span starting at or below ``ptr`` is the only one that can hold it; dead
    spans met on the way (their addresses may be reused) are forgotten."""
    i = bisect.bisect_right(_starts, ptr) - 1
    while i >= 0:
        start = _starts[i]
        end, entry_id, ref = _spans[start]
        if ref() is not None:
            return (start, end, entry_id) if ptr < end else None
        _forget(start)
        i -= 1
    return None


def live_count() -> int:
    with _lock:
        _drop_dead()
        return len(_spans)


def contains(ptr: int) -> bool:
    """Whether ``ptr`` lies in a live entry mapping of this process."""
    with _lock:
        return _live_span(ptr) is not None


def contain_all(ptrs: list[int]) -> bool:
    """Whether every address in ``ptrs`` lies in a live entry mapping: :func:`contains` for each, under one lock
    (a pipeline's provenance check asks about ~900 storages). A module's storages mostly lie in one mapping: when
    the one that holds the lowest address also holds the highest, it holds every address between."""
    if not ptrs:
        return True
    with _lock:
        span = _live_span(min(ptrs))
        if span is not None and max(ptrs) < span[1]:
            return True
        return all(_live_span(p) is not None for p in ptrs)


def locate(ptr: int, nbytes: int, pages: PageSnapshot | None = None) -> Location | None:
    """Where ``[ptr, ptr+nbytes)`` lives, if inside a live mapping whose pages there are untouched (asked of
    ``pages``, an encode's snapshot, when given; else read now)."""
    if nbytes == 0 or ptr == 0:
        return None
    with _lock:
        span = _live_span(ptr)
    if span is None:
        return None
    start, end, entry_id = span
    if ptr + nbytes > end or not (pages.pristine(ptr, nbytes) if pages is not None else is_pristine(ptr, nbytes)):
        return None
    return Location(entry_id, ptr - start)
