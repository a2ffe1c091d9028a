"""File and folder fingerprints (size, mtime, ctime, inode, device): what a path names, as far as a loader reading
it can tell, without reading it.

A file is its size, mtime_ns, ctime_ns, inode and device. ``ctime`` cannot be set by the user: a checkpoint
overwritten in place with its size kept and its mtime put back (``os.utime``) still changes it. A folder is
the fingerprint of every file below it (symlinks followed, as in a Hugging Face cache whose snapshot files
link to blobs), with their relative names.
"""
from __future__ import annotations

import os

from .._util import interrupts
from ..errors import Unkeyable

MAX_FINGERPRINT_FILES = 20_000


def _stat_row(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def fingerprint(path: str) -> tuple:
    """The fingerprint of ``path``; a folder's lists its files (raises ``Unkeyable`` past the file limit)."""
    st = os.stat(path)
    if not os.path.isdir(path):
        return _stat_row(st)
    rows: list[tuple] = [("", _stat_row(st)[3:])]
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
            rows.append((os.path.relpath(full, path),) + _stat_row(fst))
            if len(rows) > MAX_FINGERPRINT_FILES:
                raise Unkeyable(f"{path} holds more than {MAX_FINGERPRINT_FILES} files; too many to fingerprint")
    return tuple(rows)
