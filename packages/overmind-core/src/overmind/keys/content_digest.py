"""The sha256 of a file's bytes, read once per version of the file: what a portable key
(:mod:`overmind.keys.portable`) says a file is, the same on every node that holds the same bytes.

Reading a 10 GB checkpoint takes seconds, so a digest is remembered under the file's identity on
this machine, ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``: in a per-process dict and in
an sqlite file in the user's cache folder (:func:`overmind._util.user_cache.path`), which every
process of the user shares. A file rewritten in place changes its ctime (which the user cannot set
back), so a remembered digest is never of other bytes. A file changed within :data:`RACY_NS` of its
last change is read every time (git's "racily clean" rule): a second write inside one timestamp tick
would keep its identity.

A Hugging Face cache blob needs no reading: ``<cache>/models--org--name/blobs/<64 hex>`` is named by
the sha256 of its bytes (LFS files; the 40-hex names of small files are git's sha1, and those are
read).

The sqlite file is a convenience: locked, unwritable or corrupt, it is passed over and the file is
read.

>>> digest("/models/bert/config.json")
'5c1f0e2c...'
"""
from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import stat
import threading
import time

from .._util import interrupts, user_cache

RACY_NS = 2_000_000_000
MAX_REMEMBERED = 200_000  # per process; past it the dict starts over (the sqlite file still knows)
_CHUNK = 1 << 20
_BLOB = re.compile(r"^[0-9a-f]{64}$")
_REPO_PREFIXES = ("models--", "datasets--", "spaces--")

_memory: dict[tuple, str] = {}
_local: dict[str, tuple[str, tuple | None]] = {}  # sha256 -> (a file holding it, its identity then)
_lock = threading.Lock()
_db: sqlite3.Connection | None = None
_db_pid = 0
_db_failed_pid = 0  # the process that found the sqlite file unusable (it stops asking it)
# a connection inherited through fork stays open: closed in a child, it could drop the parent's locks
_forked_away: list[sqlite3.Connection] = []


def digest(path: str) -> str:
    """The sha256 hex of the bytes of the file ``path`` (links followed); raises ``OSError`` as
    ``open`` does."""
    real = os.path.realpath(path)
    named = hf_blob_digest(real)
    if named is not None:
        _note_local(named, real, None)
        return named
    found, ident = _digest(real)
    if ident is not None:
        _note_local(found, real, ident)
    return found


def local_file(sha256: str) -> int | None:
    """A read-only fd of a file of this machine that this process found to hold the bytes
    ``sha256`` names (a file it keyed by content), still as it was then; else None. A fleet import
    maps such a file instead of downloading its bytes."""
    known = _local.get(sha256)
    if known is None:
        return None
    real, ident = known
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        interrupts.raise_users(exc)
        return None
    st = os.fstat(fd)
    still = _identity(st) == ident if ident is not None else hf_blob_digest(real) == sha256
    if not still or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


def _note_local(sha256: str, real: str, ident: tuple | None) -> None:
    with _lock:
        if len(_local) >= MAX_REMEMBERED:
            _local.clear()
        _local[sha256] = (real, ident)


def _digest(real: str) -> tuple[str, tuple | None]:
    """The digest and the file identity it holds for (None: the file changed under every read)."""
    for _ in range(3):
        st = os.stat(real)
        ident = _identity(st)
        known = _memory.get(ident)
        if known is not None:
            return known, ident
        racy = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS
        known = None if racy else _lookup(ident)
        if known is None:
            known = _read(real)
            after = os.stat(real)
            if _identity(after) != ident:
                continue  # written while it was read: the bytes hashed may be of neither version
            if racy:  # a second write within the file's timestamp tick could keep its identity
                return known, None
            _remember(ident, known)
        if len(_memory) >= MAX_REMEMBERED:
            _memory.clear()
        _memory[ident] = known
        return known, ident
    return _read(real), None  # rewritten under every read: this one's bytes, remembered nowhere


def hf_blob_digest(real: str) -> str | None:
    """The sha256 a Hugging Face cache blob is named by (``.../models--org--name/blobs/<64 hex>``),
    else None."""
    folder, name = os.path.split(real)
    if not _BLOB.match(name):
        return None
    repo, blobs = os.path.split(folder)
    if blobs != "blobs" or not os.path.basename(repo).startswith(_REPO_PREFIXES):
        return None
    return name


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# --- the sqlite file ------------------------------------------------------------------------------


def db_path() -> str:
    """Where digests are remembered across processes."""
    return user_cache.path("content-digests.sqlite3")


def _connection() -> sqlite3.Connection | None:
    """This process's connection, opened on first use; None where the file cannot be used."""
    global _db, _db_pid, _db_failed_pid
    pid = os.getpid()
    if _db is not None and _db_pid == pid:
        return _db
    if _db_failed_pid == pid:
        return None
    if _db is not None:  # inherited through fork
        _forked_away.append(_db)
        _db = None
    try:
        os.makedirs(os.path.dirname(db_path()), exist_ok=True)
        db = sqlite3.connect(db_path(), timeout=1.0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
        except sqlite3.Error as exc:
            interrupts.raise_users(exc)  # another process is in a transaction: it set the mode
        db.execute("CREATE TABLE IF NOT EXISTS digests (dev INTEGER, ino INTEGER, size INTEGER,"
                   " mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT NOT NULL,"
                   " PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns)) WITHOUT ROWID")
    except (sqlite3.Error, OSError) as exc:
        interrupts.raise_users(exc)
        _db_failed_pid = pid
        return None
    _db, _db_pid = db, pid
    return db


def _lookup(ident: tuple) -> str | None:
    with _lock:
        db = _connection()
        if db is None:
            return None
        try:
            row = db.execute("SELECT sha256 FROM digests WHERE dev=? AND ino=? AND size=? AND"
                             " mtime_ns=? AND ctime_ns=?", _signed(ident)).fetchone()
        except sqlite3.Error as exc:
            interrupts.raise_users(exc)
            return None
    return row[0] if row else None


def _remember(ident: tuple, sha256: str) -> None:
    """Store the digest of ``ident``, replacing the file's older versions (one row per file)."""
    with _lock:
        db = _connection()
        if db is None:
            return
        signed = _signed(ident)
        try:
            with db:  # one transaction: BEGIN ... COMMIT, rolled back on error
                db.execute("BEGIN IMMEDIATE")
                db.execute("DELETE FROM digests WHERE dev=? AND ino=?", signed[:2])
                db.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?)",
                           (*signed, sha256))
        except sqlite3.Error as exc:  # locked past the timeout, read-only, full: read next time
            interrupts.raise_users(exc)


def _signed(ident: tuple) -> tuple:
    """``ident`` in sqlite's signed 64-bit integers (a device or inode number can set the top bit)."""
    return tuple(v - (1 << 64) if v >= 1 << 63 else v for v in ident)
