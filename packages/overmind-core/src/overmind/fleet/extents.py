"""The bytes of a blob that hold data, and only those, on the wire: an entry's memfd is sparse (a load
arena reserves more than the loader fills; storages found in other entries are left as holes), so an
upload sends the data extents of its fd (``SEEK_DATA``/``SEEK_HOLE``) packed end to end, and the
manifest records where they lie (``BlobRef.span`` and ``extents``, signed with it). A download writes
them back at their offsets into a memfd of the blob's whole length, which stays sparse.

>>> extents = data_extents(fd, os.fstat(fd).st_size)      # [(0, 4096), (1 << 20, 65536)]   # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import io
import os
from typing import Any

from .._util import interrupts

_CHUNK = 1 << 20
_PAGE = 64 << 10  # the run of zeros a download leaves unwritten (a hole of the memfd)
_ZEROS = bytes(_PAGE)


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each run of ``fd``'s first ``size`` bytes that may hold data (all of
    them where the file system cannot say)."""
    out: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == 6:  # ENXIO: no data past pos
                    break
                raise
            if start >= size:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            out.append((start, end - start))
            pos = end
    except OSError as exc:
        interrupts.raise_users(exc)
        return [(0, size)] if size else []
    return out


class ExtentReader(io.RawIOBase):
    """The ``extents`` of ``fd`` read end to end (with ``pread``: the fd's shared offset never moves),
    as a seekable file of their total length."""

    def __init__(self, fd: int, extents: list[tuple[int, int]]):
        super().__init__()
        self._fd, self._extents = fd, extents
        self._size = sum(length for _, length in extents)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        """Fills ``buffer`` across extents (short only at the end, or where the fd ends early)."""
        want = min(len(buffer), self._size - self._pos)
        done, base = 0, 0
        for offset, length in self._extents:
            if done >= want:
                break
            if self._pos < base + length:
                inside = self._pos - base
                data = os.pread(self._fd, min(want - done, length - inside), offset + inside)
                if not data:
                    break
                buffer[done:done + len(data)] = data
                done += len(data)
                self._pos += len(data)
            base += length
        return done

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def packed_digest(fd: int, extents: list[tuple[int, int]]) -> str:
    """The sha256 hex of ``fd``'s ``extents`` end to end."""
    h = hashlib.sha256()
    reader = ExtentReader(fd, extents)
    buf = bytearray(_CHUNK)
    while True:
        n = reader.readinto(buf)
        if not n:
            return h.hexdigest()
        h.update(memoryview(buf)[:n])


def write_extents(stream: Any, fd: int, extents: list[tuple[int, int]], total: int) -> tuple[int, str]:
    """Copy ``stream`` (the extents end to end) into ``fd`` at the extents' offsets, leaving all-zero
    64 KiB runs unwritten; reads up to ``total`` bytes and one more (to notice a longer blob). Returns
    ``(bytes read, sha256 hex)``."""
    h = hashlib.sha256()
    got = 0
    places = iter(extents)
    offset, left = next(places, (0, 0))
    while True:
        data = stream.read(_CHUNK)
        if not data:
            return got, h.hexdigest()
        got += len(data)
        if got > total:
            return got, ""
        h.update(data)
        view = memoryview(data)
        while view:
            while not left:
                offset, left = next(places)
            piece = view[:left]
            _write_nonzero(fd, bytes(piece), offset)
            offset, left, view = offset + len(piece), left - len(piece), view[len(piece):]


def _write_nonzero(fd: int, buf: bytes, offset: int) -> None:
    for start in range(0, len(buf), _PAGE):
        piece = buf[start:start + _PAGE]  # bytes, not a memoryview: its == is a memcmp
        if piece != _ZEROS[:len(piece)]:
            done = 0
            while done < len(piece):
                done += os.pwrite(fd, piece[done:], offset + start + done)
