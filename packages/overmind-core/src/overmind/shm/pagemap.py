"""Which pages of this process were written since they were mapped: ``/proc/self/pagemap``, read with ``pread``, for
a few ranges at once (the kernel's ``PAGEMAP_SCAN`` first, where it has one) or through an encode's
:class:`PageSnapshot`, a window of address space at a time.

A page of a ``MAP_PRIVATE`` mapping (an entry's memfd, a checkpoint file) that nobody wrote is either absent
(never faulted) or the file's own page (bit 61); a write made it a private anonymous page, and its bytes are no
longer the file's. The reference decisions (:mod:`.mappings`, :mod:`.filemaps`) and the provenance of a hit's
objects (``keys/provenance.py``) ask this module. Where pagemap cannot be read, every answer is "written": the caller
then copies the bytes rather than risk referencing modified ones.

Two ways to ask:

* :func:`all_pristine` asks about the pages of the ranges now: for each cluster of nearby ranges the kernel's
  ``PAGEMAP_SCAN`` (Linux 6.7+) looks for a written page without handing over an entry per page (far less than
  reading a ControlNet's 176k entries: docs/architecture.md, "Measured costs"). Only where it finds one (which may
  lie in a gap between the ranges) or cannot scan are the entries read and the ranges' own pages looked at;
* a :class:`PageSnapshot` reads a 64 MiB stretch of address space on its first question there and answers every
  later question in it from that read. One encode asks about thousands of storages lying side by side (a
  checkpoint's tensors in one mapping), and a read per storage costs more in calls than in bytes (a cold blog load
  would make ~2,700: docs/architecture.md, "Measured costs"). A snapshot answers as of its reads, so it lives for
  one encode, no longer.

>>> pagemap.all_pristine([(ptr, nbytes), ...])
>>> pages = pagemap.PageSnapshot(); pages.pristine(ptr, nbytes)
"""
from __future__ import annotations

import mmap
import os
import threading

from .._util import interrupts

PAGE = mmap.PAGESIZE

# Ranges closer than this many pages are read from pagemap in one go (reading a gap costs 8 bytes a page).
_MERGE_GAP_PAGES = 4096


def is_pristine(ptr: int, nbytes: int) -> bool:
    """Whether no page of ``[ptr, ptr+nbytes)`` was written since it was mapped (copy-on-write intact)."""
    return all_pristine([(ptr, nbytes)])


def all_pristine(ranges: list[tuple[int, int]]) -> bool:
    """Whether every ``(ptr, nbytes)`` range is untouched; reads /proc/self/pagemap once per cluster of
    nearby ranges (a module's parameters in one mapping are one read), not once per tensor."""
    live = [r for r in ranges if r[1] > 0]
    if not live:
        return True
    if len(live) > 1 and _extent_unwritten(live):
        return True
    spans: list[list] = []  # [first page, last page, (first, last) of each range in it...]
    for ptr, nbytes in sorted(live):
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
            if _scan_finds_no_written_page(fd, first, last):
                continue  # nothing written anywhere in the cluster, gaps included
            raw = os.pread(fd, (last - first + 1) * 8, first * 8)
            if len(raw) != (last - first + 1) * 8:
                return False
            if _written_pages(raw, first, span[2:]):
                return False
    except OSError as exc:
        interrupts.raise_users(exc)
        return False  # cannot tell: copy the bytes rather than risk referencing modified ones
    return True


# The most pages one scan of a whole extent covers (64 GiB of address space); a wider one is asked span by span.
_EXTENT_PAGES = 1 << 24


def _extent_unwritten(ranges: list[tuple[int, int]]) -> bool:
    """True when one kernel scan from the lowest range's first page to the highest range's last finds no written
    page (gaps between the ranges included: then none of them holds one). A module's storages lie in one or two
    mappings, so this one call answers for all of them, without the per-range work of the span-by-span path
    (~0.2 ms for a ControlNet's 340 storages)."""
    first = min(ranges)[0] // PAGE
    last = (max(p + n for p, n in ranges) - 1) // PAGE
    if last - first >= _EXTENT_PAGES:
        return False
    try:
        return _scan_finds_no_written_page(_pagemap_fd(), first, last)
    except OSError as exc:
        interrupts.raise_users(exc)
        return False  # the span-by-span path answers


# PAGEMAP_SCAN (linux/fs.h): _IOWR('f', 16, struct pm_scan_arg), the argument twelve u64s (96 bytes). A page's
# categories: PAGE_IS_FILE (bit 2, not an anonymous page: the file's or the memfd's own), PAGE_IS_PRESENT (bit 3),
# PAGE_IS_SWAPPED (bit 4). "Written" is what pagemap's bits say: present or swapped, and not a file page.
_PAGEMAP_SCAN = (3 << 30) | (96 << 16) | (ord("f") << 8) | 16
_IS_FILE, _IS_PRESENT, _IS_SWAPPED = 1 << 2, 1 << 3, 1 << 4
_scan_works = True  # False once the kernel said it has no PAGEMAP_SCAN: entries are read from then on


def _scan_finds_no_written_page(fd: int, first: int, last: int) -> bool:
    """True when the kernel scanned pages ``first..last`` and found none written; False when it found one, or when
    it cannot scan (the caller then reads the entries, which also says which pages were written)."""
    global _scan_works
    if not _scan_works:
        return False
    import ctypes
    import fcntl
    import struct

    found = ctypes.create_string_buffer(24)  # one struct page_region: the first written stretch, if any
    start, end = first * PAGE, (last + 1) * PAGE
    arg = bytearray(struct.pack("12Q", 96, 0, start, end, 0, ctypes.addressof(found), 1, 1, _IS_FILE, _IS_FILE,
                                _IS_PRESENT | _IS_SWAPPED, _IS_PRESENT | _IS_SWAPPED))
    try:
        regions = fcntl.ioctl(fd, _PAGEMAP_SCAN, arg)
    except OSError as exc:
        interrupts.raise_users(exc)
        _scan_works = False  # ENOTTY on a kernel before 6.7; anything else: the reading answers as before
        return False
    walk_end = struct.unpack_from("Q", arg, 32)[0]
    return regions == 0 and walk_end >= end


class PageSnapshot:
    """Written pages, read ``CHUNK_PAGES`` at a time on the first question about each stretch, then kept.

    ``pristine(ptr, nbytes)`` answers as :func:`is_pristine` would have at the moment the stretches it covers were
    read. Hold one for one encode (the loader has returned; the pickler only reads), never across user code."""

    CHUNK_PAGES = 16384  # 64 MiB of address space: a 128 KiB read

    def __init__(self) -> None:
        self._written: dict[int, bytes | None] = {}  # chunk index -> one byte per page (1: written), None: unread

    def pristine(self, ptr: int, nbytes: int) -> bool:
        if nbytes <= 0:
            return True
        first, last = ptr // PAGE, (ptr + nbytes - 1) // PAGE
        chunk = self.CHUNK_PAGES
        for c in range(first // chunk, last // chunk + 1):
            written = self._written[c] if c in self._written else self._read(c)
            if written is None:
                return False  # cannot tell: "written"
            base = c * chunk
            if 1 in written[max(first, base) - base:min(last, base + chunk - 1) - base + 1]:
                return False
        return True

    def _read(self, c: int) -> bytes | None:
        n = self.CHUNK_PAGES
        try:
            top = top_bytes(c * n, n)
        except OSError as exc:
            interrupts.raise_users(exc)
            top = b""
        written = top.translate(_WRITTEN) if len(top) == n else None
        self._written[c] = written
        return written


_pagemap: tuple[int, int] | None = None  # (pid that opened it, fd of its /proc/self/pagemap)
_pagemap_lock = threading.Lock()


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


def top_bytes(first: int, count: int, fd: int | None = None) -> bytes:
    """The top byte of this process's pagemap entry for each page ``first .. first + count - 1`` (bits 56-63: 63
    present, 62 swapped, 61 file page or shared anonymous, 56 mapped by this process alone); shorter where the read
    was. ``fd``: a pagemap the caller opened (default: this process's, kept open). Raises ``OSError`` where pagemap
    cannot be read."""
    return os.pread(_pagemap_fd() if fd is None else fd, count * 8, first * 8)[7::8]


# For each top byte (top_bytes): 1 where the page is this process's own copy: present (bit 63), mapped by this
# process alone (bit 56), and neither a file page nor shared anonymous (bit 61). Count them with
# ``top.translate(OWN_COPY).count(1)``.
OWN_COPY = bytes(1 if (b & 0x80) and (b & 0x01) and not (b & 0x20) else 0 for b in range(256))


# The top byte of a pagemap entry (little-endian u64) holds bit 63 (present), 62 (swapped) and 61 (file page or
# shared anonymous). A page was written since it was mapped if it is present or swapped and neither.
_WRITTEN = bytes(1 if (b & 0xC0) and not (b & 0x20) else 0 for b in range(256))


def _written_map(raw: bytes) -> bytes:
    """One byte per pagemap entry of ``raw``: 1 where that page was written. Untouched pages are absent (never
    faulted) or mapped from the file or memfd (bit 61 set). Plain bytes operations: a pipeline's 400k pages are
    read in about a millisecond."""
    return raw[7::8].translate(_WRITTEN)


def _written_pages(raw: bytes, base: int, pieces: list[tuple[int, int]]) -> bool:
    # Gaps between pieces don't count.
    written = _written_map(raw)
    return any(1 in written[first - base:last - base + 1] for first, last in pieces)
