"""Whether the server's runtime directory, lock and socket are still its own (a tmp cleaner, logind).

A cleaner that removes the socket leaves a server that holds the lock but cannot be reached: every client
would wait for it, then load uncached. Removing the whole directory (logind does at the last logout) leaves
a server nobody can reach, holding all its memory. The server asks ``RuntimeWatch.verdict`` a few times a
second (three ``lstat`` calls) and re-creates what it safely can or exits.

>>> watch = RuntimeWatch("/run/user/1000/overmind")
>>> watch.verdict(lock_fd, socket_identity)
'ok'
"""
from __future__ import annotations

import fcntl
import os
import time

from ..ipc import runtime

OK = "ok"
DIR_GONE = "directory gone"  # removed or replaced: exit, a new server starts in the new one
LOCK_LOST = "lock lost"  # the lock file was removed or replaced: take the lock at the path again, or exit
SOCKET_LOST = "socket lost"  # removed or replaced while this server holds the lock: bind it again

Identity = tuple[int, int]


def identity(path: str) -> Identity | None:
    """``(st_dev, st_ino)`` of ``path`` itself (never following a symlink), or None if nothing is there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def fd_identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class RuntimeWatch:
    """Compares the runtime directory's paths with what this server created and holds."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock_file = runtime.server_lock_path(directory)
        self.socket_file = os.path.join(directory, "server.sock")
        self.dir_identity = identity(directory)

    def verdict(self, lock_fd: int, socket_identity: Identity | None) -> str:
        """``OK``, or what went missing first: ``DIR_GONE``, ``LOCK_LOST`` or ``SOCKET_LOST``."""
        if identity(self.directory) != self.dir_identity:
            return DIR_GONE
        if identity(self.lock_file) != fd_identity(lock_fd):
            return LOCK_LOST
        if socket_identity is None or identity(self.socket_file) != socket_identity:
            return SOCKET_LOST
        return OK


def take_lock(path: str, tries: int = 1, pause_s: float = 0.02) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created 0600 if missing) with our pid written in it,
    or None if another process holds it through ``tries`` attempts (a launcher probing the lock holds a
    shared lock for a moment; a server holds it for good)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(pause_s)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    os.close(fd)
    return None
