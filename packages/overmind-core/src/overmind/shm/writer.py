"""Write an entry into a fresh memfd (or the miss's load arena memfd, data first) and seal it, so nobody (the writer
included) can change it afterwards.

The bytes go in with ``pwrite(2)`` straight from each storage's own memory: the kernel allocates the memfd's pages
as it copies, with no mapping of the memfd to fault in page by page. That is faster than copying through a shared
mapping, even one populated up front (docs/benchmarks-more.md, "Smaller measurements": ``write_path.py``). The
writer never holds a writable mapping, so nothing stands in the way of the seal (which fails with EBUSY while a
writable shared mapping exists).

Where libc's ``pwrite`` cannot be called through ctypes, the bytes are copied through a shared mapping as
before (``PWRITE`` says which way is in use).

A miss with a load arena (``shm/arena.py``) is written into the arena's memfd instead of a fresh one, data
first: the storages already there (``in_place``) are not written at all.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from typing import TYPE_CHECKING, Iterable

import torch

from .._util import interrupts
from . import seals
from .layout import Layout

if TYPE_CHECKING:
    from .arena import Arena

_STEP = 1 << 30  # Linux writes at most 0x7ffff000 bytes per call


def _libc_pwrite():
    try:
        fn = ctypes.CDLL(None, use_errno=True).pwrite
    except (OSError, AttributeError) as exc:
        interrupts.raise_users(exc)
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    return fn


_pwrite = _libc_pwrite()
PWRITE = _pwrite is not None


def write_entry(skeleton: bytes, storages: Iterable[tuple[torch.UntypedStorage, int]], data_len: int,
                name: str = "overmind-entry", arena: Arena | None = None) -> int:
    """Return the fd of a sealed memfd holding ``skeleton`` and each ``(storage, offset)``'s bytes.

    ``offset`` is relative to the data region; a storage off the CPU is copied through host memory.
    With ``arena`` (closed, usable), the entry is its memfd, data first; ``storages`` are the ones not in it.
    The caller owns the fd.
    """
    written = data_len
    if arena is not None:
        storages = list(storages)
        written = sum(s.nbytes() for s, _ in storages)
        layout = Layout.plan(len(skeleton), data_len, data_first=True)
        fd = os.dup(arena.fd())
    else:
        layout = Layout.plan(len(skeleton), data_len)
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, layout.total)
        from .progress import track

        with track(written, name.removeprefix("overmind:")) as advance:  # a bar only for a long publish
            if PWRITE:
                _write_by_pwrite(fd, layout, skeleton, storages, advance)
            else:
                _write_by_mapping(fd, layout, skeleton, storages, advance)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals.APPLIED)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_by_pwrite(fd: int, layout: Layout, skeleton: bytes, storages, advance=lambda n: None) -> None:
    _write_buffer(fd, layout.pack(), 0)
    _write_buffer(fd, skeleton, layout.skeleton_offset)
    for storage, offset in storages:
        n = storage.nbytes()
        if not n:
            continue
        if storage.device.type != "cpu":
            storage = storage.cpu()
        _write_memory(fd, storage.data_ptr(), n, layout.data_offset + offset)  # ``storage`` keeps it alive
        advance(n)


def _write_buffer(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:done + _STEP], offset + done)


def _write_memory(fd: int, address: int, nbytes: int, offset: int) -> None:
    """``pwrite`` ``nbytes`` from ``address`` at ``offset`` of ``fd``, through partial writes and EINTR."""
    done = 0
    while done < nbytes:
        wrote = _pwrite(fd, address + done, min(nbytes - done, _STEP), offset + done)
        if wrote < 0:
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            raise OSError(code, f"overmind: writing an entry failed: {os.strerror(code)}")
        if wrote == 0:
            raise OSError(errno.EIO, "overmind: writing an entry failed: pwrite wrote nothing")
        done += wrote


def _as_bytes_tensor(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _write_by_mapping(fd: int, layout: Layout, skeleton: bytes, storages, advance=lambda n: None) -> None:
    # MAP_POPULATE faults the whole region in one go instead of page by page during the copies.
    mm = mmap.mmap(fd, layout.total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    try:
        mm[0:len(layout.pack())] = layout.pack()
        mm[layout.skeleton_offset:layout.skeleton_offset + len(skeleton)] = skeleton
        if layout.data_len:
            region = torch.frombuffer(mm, dtype=torch.uint8, count=layout.data_len, offset=layout.data_offset)
            for storage, offset in storages:
                n = storage.nbytes()
                if n:
                    region[offset:offset + n].copy_(_as_bytes_tensor(storage))
                    advance(n)
            del region
    finally:
        mm.close()
