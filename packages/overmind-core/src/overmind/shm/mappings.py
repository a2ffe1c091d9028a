"""The registry of this process's live entry mappings, to recognise a storage that already lives in one.

File entries (checkpoint files, see :mod:`.filemaps`) are registered too: a storage of a file-backed hit is
located at its offset in the file, and the next entry holding it references the same file entry.

A storage found here is referenced by the next entry that contains it instead of being copied again
(``from_pretrained(..., vae=vae)``), but only while its pages are pristine: a page the user wrote to
became a private anonymous page, and its bytes are no longer the entry's. /proc/self/pagemap tells
(bit 61: file or shared page); where pagemap cannot be read, the storage is copied, never referenced.
"""
from __future__ import annotations

import bisect
import mmap
import os
import threading
import weakref
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .reader import EntryMapping, FileMapping

PAGE = mmap.PAGESIZE
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


def locate(ptr: int, nbytes: int) -> Location | None:
    """Where ``[ptr, ptr+nbytes)`` lives, if inside a live mapping whose pages there are untouched."""
    if nbytes == 0 or ptr == 0:
        return None
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i < 0:
            return None
        start = _starts[i]
        end, entry_id, _ = _spans[start]
    if ptr + nbytes > end or not is_pristine(ptr, nbytes):
        return None
    return Location(entry_id, ptr - start)


def is_pristine(ptr: int, nbytes: int) -> bool:
    """Whether no page of ``[ptr, ptr+nbytes)`` was written since it was mapped (copy-on-write intact)."""
    return all_pristine([(ptr, nbytes)])


# Ranges closer than this many pages are read from pagemap in one go (reading a gap costs 8 bytes a page).
_MERGE_GAP_PAGES = 4096


def all_pristine(ranges: list[tuple[int, int]]) -> bool:
    """Whether every ``(ptr, nbytes)`` range is untouched; reads /proc/self/pagemap once per cluster of
    nearby ranges (a module's parameters in one mapping are one read), not once per tensor."""
    spans: list[list] = []  # [first page, last page, (first, last) of each range in it...]
    for ptr, nbytes in sorted(r for r in ranges if r[1] > 0):
        first, last = ptr // PAGE, (ptr + nbytes - 1) // PAGE
        if spans and first <= spans[-1][1] + _MERGE_GAP_PAGES:
            spans[-1][1] = max(spans[-1][1], last)
            spans[-1].append((first, last))
        else:
            spans.append([first, last, (first, last)])
    if not spans:
        return True
    try:
        fd = _pagemap_fd()
        for span in spans:
            first, last = span[0], span[1]
            raw = os.pread(fd, (last - first + 1) * 8, first * 8)
            if len(raw) != (last - first + 1) * 8:
                return False
            if _written_pages(raw, first, span[2:]):
                return False
    except OSError:
        return False  # cannot tell: copy the bytes rather than risk referencing modified ones
    return True


_pagemap: tuple[int, int] | None = None  # (pid that opened it, fd of its /proc/self/pagemap)
_pagemap_lock = threading.Lock()  # not the registry's _lock: that one guards the spans, this one the fd


def _pagemap_fd() -> int:
    """This process's pagemap, opened once (a cold pipeline asks ~2,700 times: an open and a close each cost more
    than the read). Kept with the pid that opened it: a child forked by any means (``os.fork``, or a C library's
    ``fork()`` that runs no Python hook) opens its own, never reading its parent's pages as its own."""
    global _pagemap
    pid = os.getpid()
    with _pagemap_lock:
        if _pagemap is None or _pagemap[0] != pid:
            # (a child leaves the fd it inherited open: by now that number may be another file of its own)
            _pagemap = (pid, os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        return _pagemap[1]


# The top byte of a pagemap entry (little-endian u64) holds bit 63 (present), 62 (swapped) and 61 (file page or
# shared anonymous). A page was written since it was mapped if it is present or swapped and neither.
_WRITTEN = bytes(1 if (b & 0xC0) and not (b & 0x20) else 0 for b in range(256))


def _written_pages(raw: bytes, base: int, pieces: list[tuple[int, int]]) -> bool:
    # Untouched pages are absent (never faulted) or mapped from the memfd (bit 61 set). Gaps between pieces
    # don't count. Plain bytes operations: a pipeline's 400k pages are read in about a millisecond.
    written = raw[7::8].translate(_WRITTEN)
    return any(1 in written[first - base:last - base + 1] for first, last in pieces)
