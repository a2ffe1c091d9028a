"""Map an entry copy-on-write and hand out zero-copy storages over it (a file entry: the whole checkpoint file,
storages at their file offsets).

Every load maps the memfd afresh with MAP_PRIVATE: an in-place write by the user (``p.data.add_(1)``,
``load_state_dict``) lands in a private page of this one object, never in the cache, never in another
process, and never in another object loaded from the same entry in this process.

A file entry (a checkpoint file whose pages an entry references, see :mod:`.filemaps`) is mapped the same way,
the whole file with no header: its storages are sliced at their offsets in the file, as the plain lazy load
of that file had them. :func:`map_entry` picks the kind by the entry id.

With a CUDA build of torch, each mapping also gets a read-only shared twin (:mod:`.twins`) that copies to a GPU
read from.
"""
from __future__ import annotations

import ctypes
import os

import torch

from ..ipc.protocol import is_file_entry
from ..native import zerocopy
from . import gpu_copies, mappings, twins
from .fdless import map_private
from .layout import Layout


def _map(fd: int, size: int):
    """A private mapping of ``size`` bytes of ``fd``: ``(mmap, its address, a memoryview of it)``."""
    mm = map_private(fd, size)
    probe = ctypes.c_char.from_buffer(mm)
    address = ctypes.addressof(probe)
    del probe
    return mm, address, memoryview(mm)


class EntryMapping:
    """One private mapping of one entry's memfd; it holds no fd (the caller closes ``fd`` when done)."""

    __slots__ = ("entry_id", "mm", "layout", "address", "_view", "__weakref__")

    def __init__(self, entry_id: str, fd: int):
        size = os.fstat(fd).st_size
        self.entry_id = entry_id
        self.mm, self.address, self._view = _map(fd, size)
        self.layout = Layout.unpack(self.mm, size)
        mappings.register(entry_id, self.data_address, self.address + len(self.mm), self.mm)
        if twins.enabled() and twins.attach(self.mm, self.address, fd, size):
            gpu_copies.install()

    @property
    def data_address(self) -> int:
        return self.address + self.layout.data_offset

    def skeleton(self) -> memoryview:
        lo = self.layout.skeleton_offset
        return self._view[lo:lo + self.layout.skeleton_len]

    def storage(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        """A zero-copy storage over ``nbytes`` at ``offset`` of the data region; it keeps the mapping alive."""
        if offset < 0 or offset + nbytes > self.layout.data_len:
            raise ValueError(f"storage [{offset}, +{nbytes}) lies outside entry {self.entry_id}'s "
                             f"{self.layout.data_len} data bytes")
        lo = self.layout.data_offset + offset
        return zerocopy.storage_from_buffer_range(self._view, lo, nbytes)


class FileMapping:
    """One private mapping of a whole checkpoint file (a file entry); it holds no fd."""

    __slots__ = ("entry_id", "mm", "size", "address", "_view", "__weakref__")

    def __init__(self, entry_id: str, fd: int):
        self.entry_id = entry_id
        self.size = os.fstat(fd).st_size
        if self.size <= 0:
            raise ValueError(f"file entry {entry_id} is an empty file (truncated since it was published?)")
        self.mm, self.address, self._view = _map(fd, self.size)
        mappings.register(entry_id, self.data_address, self.address + len(self.mm), self.mm)
        if twins.enabled() and twins.attach(self.mm, self.address, fd, self.size):
            gpu_copies.install()

    @property
    def data_address(self) -> int:
        return self.address  # storages are placed by their offset in the file

    def storage(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        """A zero-copy storage over ``nbytes`` at file offset ``offset``; it keeps the mapping alive."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"storage [{offset}, +{nbytes}) lies outside file entry {self.entry_id}'s "
                             f"{self.size} bytes (the file shrank?)")
        return zerocopy.storage_from_buffer_range(self._view, offset, nbytes)


def map_entry(entry_id: str, fd: int) -> EntryMapping | FileMapping:
    """A private mapping of ``fd``: a file entry's whole file, or a memfd entry by its layout."""
    return FileMapping(entry_id, fd) if is_file_entry(entry_id) else EntryMapping(entry_id, fd)
