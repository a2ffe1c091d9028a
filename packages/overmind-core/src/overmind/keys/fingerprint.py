"""File and folder fingerprints (size, mtime, ctime, inode, device): what a path names, as far as a loader reading
it can tell, without reading it.

A file is its size, mtime_ns, ctime_ns, inode and device. ``ctime`` cannot be set by the user: a checkpoint
overwritten in place with its size kept and its mtime put back (``os.utime``) still changes it. A folder is
the fingerprint of every file below it (symlinks followed, as in a Hugging Face cache whose snapshot files
link to blobs), with their relative names.

Inside :func:`overmind.keys.portable.portable_mode` (the :data:`PORTABLE` switch) a file is its
size and the sha256 of its bytes (:mod:`overmind.keys.content_digest`) instead: inodes, devices and
times belong to one node, and a key other nodes look up must say only what the files hold.
"""
from __future__ import annotations

import contextvars
import os
import stat

from .._util import interrupts
from ..errors import Unkeyable

MAX_FINGERPRINT_FILES = 20_000

# Per thread and per asyncio task (a context variable): one thread computing a fleet key leaves
# every other thread's local keys as they are. Set only by overmind.keys.portable.portable_mode().
PORTABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("overmind_portable", default=False)


def _stat_row(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _content_row(path: str, st: os.stat_result) -> tuple:
    from . import content_digest  # sqlite3 is imported only where a portable key is made

    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block the read, or never end
        raise Unkeyable(f"{path} is not a regular file; a portable key cannot describe its content")
    try:
        return (st.st_size, content_digest.digest(path))
    except OSError as exc:  # not canon's "no such path": that would key the path's spelling instead
        interrupts.raise_users(exc)
        raise Unkeyable(f"cannot read {path} to key it by content ({exc})") from None


def fingerprint(path: str) -> tuple:
    """The fingerprint of ``path``; a folder's lists its files (raises ``Unkeyable`` past the file limit)."""
    portable = PORTABLE.get()
    st = os.stat(path)
    if not os.path.isdir(path):
        return ("content",) + _content_row(path, st) if portable else _stat_row(st)
    rows: list[tuple] = [("", "folder") if portable else ("", _stat_row(st)[3:])]
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                fst = os.stat(full)
            except OSError as exc:
                interrupts.raise_users(exc)
                rows.append((os.path.relpath(full, path), "dangling"))
                continue
            row = _content_row(full, fst) if portable else _stat_row(fst)
            rows.append((os.path.relpath(full, path),) + row)
            if len(rows) > MAX_FINGERPRINT_FILES:
                raise Unkeyable(f"{path} holds more than {MAX_FINGERPRINT_FILES} files; too many to fingerprint")
    return tuple(rows)
