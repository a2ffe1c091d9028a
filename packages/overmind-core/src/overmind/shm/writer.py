"""Write an entry into a fresh memfd and seal it, so nobody (the writer included) can change it afterwards.

Only the writer ever holds a writable mapping, and it is unmapped before sealing: the seal itself fails
with EBUSY while a writable shared mapping exists.
"""
from __future__ import annotations

import fcntl
import mmap
import os
from typing import Iterable

import torch

from . import seals
from .layout import Layout


def _as_bytes_tensor(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def write_entry(skeleton: bytes, storages: Iterable[tuple[torch.UntypedStorage, int]], data_len: int,
                name: str = "overmind-entry") -> int:
    """Return the fd of a sealed memfd holding ``skeleton`` and each ``(storage, offset)``'s bytes.

    ``offset`` is relative to the data region; a CUDA storage is copied through host memory.
    The caller owns the fd.
    """
    layout = Layout.plan(len(skeleton), data_len)
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, layout.total)
        # MAP_POPULATE faults the whole region in one go instead of page by page during the copies.
        mm = mmap.mmap(fd, layout.total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        try:
            mm[0:len(layout.pack())] = layout.pack()
            mm[layout.skeleton_offset:layout.skeleton_offset + len(skeleton)] = skeleton
            if data_len:
                region = torch.frombuffer(mm, dtype=torch.uint8, count=data_len, offset=layout.data_offset)
                for storage, offset in storages:
                    n = storage.nbytes()
                    if n:
                        region[offset:offset + n].copy_(_as_bytes_tensor(storage))
                del region
        finally:
            mm.close()
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals.APPLIED)
        return fd
    except BaseException:
        os.close(fd)
        raise
