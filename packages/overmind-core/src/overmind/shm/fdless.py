"""Map a file without keeping its fd: ``map_private(fd, size)`` (copy-on-write) and ``map_shared_readonly(fd,
size)`` (the file's own pages, read-only) return an ``mmap.mmap``.

``mmap.mmap(fd, ...)`` keeps a dup of ``fd`` for as long as the mapping lives, so a process holding 1,000
loaded objects held 1,000 fds and hit ``ulimit -n``. The kernel needs no fd once a mapping exists, so:
reserve the range as an anonymous ``mmap.mmap`` (which holds no fd and owns the range: it unmaps it when
the last buffer over it goes), then map the file over that very range with ``MAP_FIXED`` through libc.
The ``mmap.mmap`` object is then a buffer over the file's private pages; the caller closes ``fd`` at once.

Where libc's ``mmap`` cannot be called (no ctypes, a libc without it), ``map_private`` falls back to
``mmap.mmap(fd, ...)``, which works and holds one fd per mapping; ``FDLESS`` says which one is in use.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os

from .._util import interrupts

_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc_mmap():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.mmap
    except (OSError, AttributeError) as exc:
        interrupts.raise_users(exc)
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return fn


_mmap = _libc_mmap()
FDLESS = _mmap is not None


def map_private(fd: int, size: int) -> mmap.mmap:
    """A writable copy-on-write (MAP_PRIVATE) mapping of ``size`` bytes of ``fd`` that holds no fd."""
    if not FDLESS or size <= 0:
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    return _map_over_reserved(fd, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE)


def map_shared_readonly(fd: int, size: int) -> mmap.mmap:
    """A read-only MAP_SHARED mapping of ``size`` bytes of ``fd`` that holds no fd: the file's own page-cache
    pages, which no write through this process can replace (see :mod:`.twins`). The ``mmap.mmap`` object reads
    as writable (the range is reserved writable to learn its address); its pages are not, and a write faults."""
    if not FDLESS or size <= 0:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    return _map_over_reserved(fd, size, mmap.PROT_READ, mmap.MAP_SHARED)


def _map_over_reserved(fd: int, size: int, prot: int, flags: int) -> mmap.mmap:
    reserved = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(reserved))
        got = _mmap(address, size, prot, flags | _MAP_FIXED, fd, 0)
        if got is None or got == _MAP_FAILED or got != address:
            code = ctypes.get_errno() or errno.EINVAL
            raise OSError(code, f"mmap of the entry over its reserved range failed: {os.strerror(code)}")
    except BaseException:
        reserved.close()
        raise
    return reserved
