"""The template's dense private anonymous memory mapped as 2 MiB pages (``MADV_COLLAPSE``) before it forks, so that
each child's fork and exit handle a few hundred page-table entries instead of tens of thousands.

Every program ``overmind run`` starts is a fork of the template, and the kernel handles the private anonymous memory
a fork shares one page-table entry at a time: it copies the entries at the fork and takes them down at the exit. A
template holding torch, transformers and diffusers has ~370 MiB of such memory, ~95,000 entries of 4 KiB pages,
copied at every fork and taken down at every exit, and the exit is on the path of every ``run`` (the launcher gets
the exit status once the kernel has taken the process down). Mapped as 2 MiB pages the same memory is a few hundred
entries, and a fork and an exit take a fraction of the time (docs/run.md, "How fast").

:func:`collapse` asks the kernel to map each 2 MiB-aligned range of those mappings as one huge page, once the
template has imported and built what it holds (and again after it builds objects ahead anew). Nothing a program
sees changes: the bytes are the same, and a child that writes to a huge page it shares with the template copies only
the 4 KiB page it writes (the kernel splits the huge mapping in that process). A range is collapsed only where at
least 7/8 of its pages already hold memory of the template's own, so the template's memory grows by at most an
eighth of what is collapsed (in practice not at all: a heap is dense). A kernel without ``MADV_COLLAPSE`` (before
Linux 6.1) or with transparent huge pages off refuses, and the template keeps its 4 KiB pages.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("overmind.runner")

MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h (Linux 6.1)
HUGE = 2 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MIN_PRESENT = 7 / 8  # of a range's pages, for it to be collapsed


def candidate_ranges(maps_text: str) -> list[tuple[int, int]]:
    """The 2 MiB-aligned ranges inside the private, writable, anonymous mappings of ``/proc/<pid>/maps`` text
    (the heap and named anonymous mappings included; stacks, files, memfds and shared memory left out)."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3:4] != "p" or parts[4] != "0":
            continue  # not private and writable, or backed by a file or a memfd (an inode other than 0)
        name = parts[5].strip() if len(parts) > 5 else ""
        if name not in ("", "[heap]") and not name.startswith("[anon:"):
            continue  # [stack], [vvar], [vdso]
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        first, last = (lo + HUGE - 1) // HUGE * HUGE, hi // HUGE * HUGE
        out.extend((a, a + HUGE) for a in range(first, last, HUGE))
    return out


def _dense(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of ``ranges`` with at least :data:`_MIN_PRESENT` of their pages this process's own copies (present and
    mapped by this process alone: ``shm/pagemap.OWN_COPY``). A page read but never written maps the kernel's shared
    zero page: it takes no memory, and a huge page in its place would. (Memory a child of the template still shares
    is not counted either: it was collapsed, or left, before that child was forked.)"""
    from ..shm.pagemap import OWN_COPY, top_bytes

    per_range = HUGE // _PAGE
    dense = []
    # Opened here and closed (not the descriptor shm/pagemap.py keeps open): a template's children inherit no
    # descriptor of its own.
    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for lo, hi in ranges:
            if top_bytes(lo // _PAGE, per_range, fd).translate(OWN_COPY).count(1) >= per_range * _MIN_PRESENT:
                dense.append((lo, hi))
    finally:
        os.close(fd)
    return dense


def collapse() -> int:
    """Collapse this process's dense private anonymous 2 MiB ranges into huge pages; returns the bytes collapsed
    (0 where the kernel cannot). Never raises: a range the kernel refuses stays as it is."""
    try:
        with open("/proc/self/maps") as f:
            ranges = _dense(candidate_ranges(f.read()))
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError, ValueError) as exc:
        log.debug("huge pages: not asked (%s)", exc)
        return 0
    done, refused = 0, {}
    for lo, hi in ranges:
        if madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
        else:  # EINVAL: no MADV_COLLAPSE here, or a mapping the kernel keeps in small pages; EAGAIN: no huge page free
            errno = ctypes.get_errno()
            refused[errno] = refused.get(errno, 0) + 1
    log.debug("huge pages: %d MiB collapsed in %d ranges; refused: %s", done >> 20, done // HUGE,
              {os.strerror(e): n for e, n in refused.items()} or "none")
    return done
