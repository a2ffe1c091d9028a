"""Which storages are untouched private mappings of a checkpoint file (``/proc/self/maps``, pagemap, ``fstat``):
referenced in the file, not copied (``OVERMIND_FILE_REFERENCES``).

A safetensors checkpoint loaded without a dtype conversion is already a lazy ``MAP_PRIVATE`` mapping of the
file: every parameter's bytes lie in a ``rw-p`` line of ``/proc/self/maps`` naming the file, and a page not
written since is the file's own page-cache page (pagemap bit 61). Copying such bytes into a memfd costs time
and a second copy of the weights; the entry references the file instead (a *file entry* on the server, which
holds a read-only fd of it), and a hit maps the file privately, as the plain load did.

Referenced only when every check holds, else copied as before:

- ``[ptr, ptr+nbytes)`` lies in one private (``p``) mapping of a path (adjacent lines of one mapping split by
  ``mprotect`` count as one); not anonymous, ``[heap]``, a memfd or a ``(deleted)`` file;
- the path, opened ``O_RDONLY``, is a regular file with the mapping's device and inode, and the range lies
  within its size;
- no page of the range was written (:mod:`.pagemap`): a page the loader or the user wrote is a private
  anonymous page, and its bytes are no longer the file's.

>>> maps = FileMaps()
>>> maps.locate(storage.data_ptr(), storage.nbytes())      # FileLocation(file_id, offset) or None
>>> files = open_referenced(deps)                          # [(description, fd)] for the publish; closes nothing
"""
from __future__ import annotations

import bisect
import os
import re
import stat
from typing import NamedTuple

from .._util import interrupts
from ..errors import OvermindError
from ..ipc.protocol import file_entry_id, file_identity, is_file_entry
from . import pagemap

_MAX_KNOWN = 4096


class FileChanged(OvermindError):
    """A checkpoint file a new entry references changed between reading its pages and publishing."""

    reason = "file changed"


class FileRef(NamedTuple):
    file_id: str
    path: str
    identity: dict  # protocol.file_identity of the file when its pages were found clean


class FileLocation(NamedTuple):
    file_id: str
    offset: int  # in the file


class _Span(NamedTuple):
    start: int
    end: int
    offset: int  # file offset of ``start``
    dev: int
    ino: int
    path: str


# file id -> what detection saw, so that the publish opens the very file (and checks it is still that file).
_known: dict[str, FileRef] = {}


# A shared library's mapping: a path ending in ``.so`` or a versioned soname (``libc.so.6``). Skipped, so a storage
# there (none is) would be copied into the entry, never referenced: the safe side.
_SHARED_LIBRARY = re.compile(rb"\.so(?:\.[0-9]+)*$")


def _parse_maps() -> list[_Span]:
    """The private file mappings of this process, adjacent pieces of one mapping merged, sorted by start."""
    spans: list[_Span] = []
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        interrupts.raise_users(exc)
        return spans
    for line in lines:
        if _SHARED_LIBRARY.search(line):
            continue  # ~90% of the lines (1035 with torch and diffusers imported): no tensor lives in a library's code
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue  # anonymous
        addresses, perms, offset, dev, inode, raw_path = fields
        path = raw_path.strip().decode("utf-8", "surrogateescape")
        if len(perms) < 4 or perms[3:4] != b"p" or inode == b"0" or not path.startswith("/"):
            continue
        if path.endswith(" (deleted)") or path.startswith("/memfd:"):
            continue
        try:
            lo, hi = (int(x, 16) for x in addresses.split(b"-"))
            major, minor = (int(x, 16) for x in dev.split(b":"))
            span = _Span(lo, hi, int(offset, 16), os.makedev(major, minor), int(inode), path)
        except ValueError:
            continue
        last = spans[-1] if spans else None
        if (last is not None and last.end == span.start and (last.dev, last.ino, last.path) ==
                (span.dev, span.ino, span.path) and last.offset + (last.end - last.start) == span.offset):
            spans[-1] = last._replace(end=span.end)
        else:
            spans.append(span)
    spans.sort()
    return spans


class FileMaps:
    """This process's file mappings, read from /proc/self/maps once (on the first question) per encode; the pages'
    state asked of ``pages``, the encode's snapshot (a new one if none is given)."""

    def __init__(self, pages: pagemap.PageSnapshot | None = None) -> None:
        self._pages = pages if pages is not None else pagemap.PageSnapshot()
        self._spans: list[_Span] | None = None
        self._starts: list[int] = []
        self._files: dict[tuple[int, int, str], FileRef | None] = {}

    def locate(self, ptr: int, nbytes: int) -> FileLocation | None:
        """Where in a checkpoint file ``[ptr, ptr+nbytes)`` lies, if it is an untouched private mapping of it."""
        if nbytes <= 0 or ptr == 0:
            return None
        if self._spans is None:
            self._spans = _parse_maps()
            self._starts = [s.start for s in self._spans]
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return None
        span = self._spans[i]
        if ptr + nbytes > span.end:
            return None
        ref = self._file(span)
        offset = span.offset + (ptr - span.start)
        if ref is None or offset + nbytes > ref.identity["size"]:
            return None
        if not self._pages.pristine(ptr, nbytes):
            return None
        _remember(ref)
        return FileLocation(ref.file_id, offset)

    def _file(self, span: _Span) -> FileRef | None:
        ident = (span.dev, span.ino, span.path)
        if ident not in self._files:
            self._files[ident] = _open_identity(span)
        return self._files[ident]


def _open_identity(span: _Span) -> FileRef | None:
    try:
        fd = os.open(span.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        interrupts.raise_users(exc)
        return None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        interrupts.raise_users(exc)
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (span.dev, span.ino):
        return None  # another file now has that name (replaced by rename), or a mount shows it differently
    identity = file_identity(st)
    return FileRef(file_entry_id(identity), span.path, identity)


def _remember(ref: FileRef) -> None:
    if ref.file_id not in _known and len(_known) >= _MAX_KNOWN:
        del _known[next(iter(_known))]
    _known[ref.file_id] = ref


def open_referenced(deps) -> list[tuple[dict, int]]:
    """For each file entry in ``deps`` that this process found in its mappings: ``(description, fd)``, the fd
    read-only and the description the identity the server checks. The caller closes the fds.

    A file entry referenced through a mapping of an earlier hit (``vae=vae``) the server already holds; it is
    sent only when this process also knows it by path. Raises :class:`FileChanged` if a file is no longer what
    its pages were checked against (then copy everything)."""
    out: list[tuple[dict, int]] = []
    try:
        for file_id in sorted(d for d in deps if is_file_entry(d)):
            ref = _known.get(file_id)
            if ref is None:
                continue
            try:
                fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                interrupts.raise_users(e)
                raise FileChanged(f"overmind: {ref.path} cannot be opened any more ({e.strerror})") from None
            out.append(({"entry_id": file_id, "path": ref.path, **ref.identity}, fd))
            if file_identity(os.fstat(fd)) != ref.identity:
                raise FileChanged(f"overmind: {ref.path} changed while its pages were being referenced")
    except BaseException:
        for _, fd in out:
            os.close(fd)
        raise
    return out
