"""The pages a program's loads copy from the template: recorded as a generation's first taking program ends, and
copied by the next spares before the request instead.

A child forked from the template shares the template's memory copy-on-write: the first write to a page (a reference
count a hit changes, a code object the interpreter specializes, an allocator pool) stops the process for a fault and
a 4 KiB copy. The blog's four loads in a child make ~400 of them (docs/architecture.md, "Measured costs": what they
cost). A spare is the process that becomes the program (:mod:`.spare`), so a page the spare copies while it waits is
already the program's own when the program writes it.

The first program of a template generation (the template's state between two rebuilds of the objects built ahead)
that took an object built ahead records, as it ends, which pages of the anonymous writable private mappings it holds
a copy of (``/proc/self/pagemap``: present and exclusive to the process): :func:`record`. Every later spare of that
generation copies those pages before it waits (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14 and later; elsewhere
nothing is copied): :func:`copy_ahead`. Only where bytes live changes, never what they are: a program sees nothing
but the time its first loads take. File mappings are left out (entry memfds and checkpoint files among them: their
pages must stay the file's for the pristine checks of ``shm/pagemap.py``). At most :data:`MAX_PAGES` are recorded,
lowest addresses first, so a spare holds at most that much memory more than a program that writes none of them.

>>> copy_ahead(template.pages_path())     # in the spare, before it waits
>>> arm(template.pages_path())            # in the child; finish() then calls record_at_end()
"""
from __future__ import annotations

import os
import re
import struct
from typing import Callable

PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_PAGES = 8192  # 32 MiB of 4 KiB pages; the blog script copies ~4,700 in all
MAX_REGION_PAGES = 1 << 20  # a mapping larger than 4 GiB is not read page by page
_MAGIC = b"overmind-page-copies-1\n"
_MADV_POPULATE_WRITE = 23
_ANONYMOUS = ("", "[heap]", "[stack]")

_armed: tuple[int, str] | None = None  # (pid, path): this process records there at its end


def regions() -> list[tuple[int, int]]:
    """``(first page, page count)`` of this process's anonymous writable private mappings."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            perms = parts[1]
            name = parts[5].strip() if len(parts) > 5 else ""
            if perms[1] != "w" or perms[3] != "p" or name not in _ANONYMOUS:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if (end - start) // PAGE <= MAX_REGION_PAGES:
                out.append((start // PAGE, (end - start) // PAGE))
    return out


def copied_pages(limit: int = MAX_PAGES) -> list[tuple[int, int]]:
    """``(first page, count)`` runs of the pages this process holds its own copy of, in those mappings, lowest
    addresses first, at most ``limit`` pages in all."""
    from ..shm import pagemap

    runs: list[tuple[int, int]] = []
    left = limit
    for first, count in regions():
        for m in re.finditer(b"\x01+", pagemap.top_bytes(first, count).translate(pagemap.OWN_COPY)):
            n = min(m.end() - m.start(), left)
            runs.append((first + m.start(), n))
            left -= n
            if left == 0:
                return runs
    return runs


def record(path: str) -> int:
    """Write :func:`copied_pages` to ``path`` (whole: written aside, then renamed); the number of pages."""
    runs = copied_pages()
    data = _MAGIC + b"".join(struct.pack("<QQ", first, count) for first, count in runs)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return sum(count for _, count in runs)


def read(path: str) -> list[tuple[int, int]]:
    """The runs recorded at ``path``; none where there is no record or it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if not data.startswith(_MAGIC) or (len(data) - len(_MAGIC)) % 16:
        return []
    body = data[len(_MAGIC):]
    return [struct.unpack_from("<QQ", body, i) for i in range(0, len(body), 16)][:MAX_PAGES]


def _within(runs: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``runs`` that lie in ``spans`` (both ``(first page, count)``, sorted by first page)."""
    out = []
    i = 0
    for first, count in sorted(runs):
        end = first + count
        while i < len(spans) and spans[i][0] + spans[i][1] <= first:
            i += 1
        j = i
        while j < len(spans) and spans[j][0] < end:
            lo, hi = max(first, spans[j][0]), min(end, spans[j][0] + spans[j][1])
            if lo < hi:
                out.append((lo, hi - lo))
            j += 1
    return out


CHUNK_PAGES = 256  # copied between two looks at whether to stop (~0.3 ms)


def copy_ahead(path: str, stop: Callable[[], bool] | None = None) -> int:
    """Take this process's own copy of each page recorded at ``path`` that lies in one of its anonymous writable
    private mappings here (never an entry's or a checkpoint's page, whose copy would read as written); the number of
    pages copied. ``stop()`` is asked every :data:`CHUNK_PAGES` pages, and a true answer ends the copying (a request
    arrived: it does not wait for pages it can copy itself). A kernel without ``MADV_POPULATE_WRITE`` copies
    nothing."""
    recorded = read(path)
    runs = _within(recorded, regions()) if recorded else []  # no record: /proc/self/maps is not read
    if not runs:
        return 0
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    copied = 0
    for first, count in runs:
        for start in range(first, first + count, CHUNK_PAGES):
            if stop is not None and stop():
                return copied
            n = min(CHUNK_PAGES, first + count - start)
            if madvise(start * PAGE, n * PAGE, _MADV_POPULATE_WRITE) == 0:
                copied += n
            elif ctypes.get_errno() == 22:  # EINVAL: this kernel has no MADV_POPULATE_WRITE
                return copied
    return copied


def arm(path: str) -> None:
    """Have this process record at ``path`` as it ends (:func:`record_at_end`), unless a record is there by then."""
    global _armed
    _armed = (os.getpid(), path)


def record_at_end() -> None:
    """At a program's end, in the process :func:`arm` was called in: record, if the program took an object built
    ahead and no record of this generation exists. Never raises: the program's end is not Overmind's to change."""
    try:
        if _armed is None or _armed[0] != os.getpid() or os.path.exists(_armed[1]):
            return
        from ..entries import prebuilt

        if prebuilt.taken():
            record(_armed[1])
    except BaseException:
        pass


def forget(directory: str, template_id: str) -> None:
    """Remove the records of every generation of the template ``template_id`` (and any left half-written)."""
    prefix = template_id + "."
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        generation = name[len(prefix):].split(".", 1)[0]
        if name.startswith(prefix) and generation.isdigit() and ".pages" in name:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
