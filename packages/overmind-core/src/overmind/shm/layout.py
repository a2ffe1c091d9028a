"""The byte layout of one entry's memfd.

```
0            header: magic, skeleton offset/length, data offset/length (little-endian u64)
64           the skeleton: the pickle of the object graph, storages left out
data_offset  page aligned; the storages, each at an offset relative to data_offset that is congruent to the
             storage's own address modulo 64 (STORAGE_ALIGN): a copy is aligned as the loader's storage was
```

An entry written into a load arena (``shm/arena.py``) has its data first, because the loader's tensors were
already there when the skeleton was made: the header page, then the data region from offset 4096 (the
arena's ranges at their offsets, the other storages after them), then the skeleton. The header says where
each region is, so a reader does not care which order an entry has.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import OvermindError

MAGIC = b"OVMD0001"
HEADER = struct.Struct("<8sQQQQ")
HEADER_SIZE = 64
PAGE = 4096
STORAGE_ALIGN = 64
DATA_FIRST_OFFSET = PAGE  # where the data region of a data-first entry (a load arena's) starts


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class LayoutError(OvermindError, ValueError):
    """The memfd does not hold a well-formed entry (truncated, foreign or from another format version)."""


@dataclass(frozen=True)
class Layout:
    skeleton_offset: int
    skeleton_len: int
    data_offset: int
    data_len: int

    @classmethod
    def plan(cls, skeleton_len: int, data_len: int, *, data_first: bool = False) -> Layout:
        if data_first:
            return cls(align(DATA_FIRST_OFFSET + data_len, STORAGE_ALIGN), skeleton_len, DATA_FIRST_OFFSET, data_len)
        data_offset = align(HEADER_SIZE + skeleton_len, PAGE)
        return cls(HEADER_SIZE, skeleton_len, data_offset, data_len)

    @property
    def total(self) -> int:
        return max(self.data_offset + self.data_len, self.skeleton_offset + self.skeleton_len, PAGE)

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.skeleton_offset, self.skeleton_len, self.data_offset, self.data_len)

    @classmethod
    def unpack(cls, buf, size: int) -> Layout:
        if size < HEADER_SIZE:
            raise LayoutError(f"entry is {size} bytes, smaller than its header")
        magic, so, sl, do, dl = HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise LayoutError(f"entry has magic {magic!r}, expected {MAGIC!r} (written by another Overmind version?)")
        layout = cls(so, sl, do, dl)
        overlap = sl and dl and so < do + dl and do < so + sl
        if so < HEADER_SIZE or do < HEADER_SIZE or so + sl > size or do + dl > size or overlap:
            raise LayoutError(f"entry header {layout} does not fit its {size} bytes (truncated?)")
        return layout
