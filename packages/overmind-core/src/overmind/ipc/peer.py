"""Who is at the other end of a socket (``SO_PEERCRED``): the client trusts a server, and ``overmind run`` a
template, only if it is this user's; the server reads its peers' pids.

Everything a server sends is acted on: its memfds are mapped and its skeleton is unpickled, which runs
code. So before the client sends a byte it checks, on the connected socket, that the kernel's record of
the listening process (``SO_PEERCRED``) has the client's own uid. The socket file's owner is checked too,
before connecting, for a clear message in the common misconfiguration; the peer check is the one that
holds against a directory swapped between the check and ``connect()``, because it is taken from the
connection itself. See docs/architecture.md, "Trust boundary".
"""
from __future__ import annotations

import _socket  # not socket, for the launcher of ``overmind run`` (see protocol.py)
import os
import stat
import struct

from ..errors import ServerUnavailable

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class UntrustedServer(ServerUnavailable):
    """The socket or the process answering on it belongs to another user: nothing is sent or read."""


def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process that listens at the other end of the connected ``sock``."""
    return _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))


def check_socket_file(path: str) -> None:
    """Raise ``UntrustedServer`` if ``path`` exists but is not a socket of this user (a missing file is
    left to ``connect`` to report)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    uid = os.getuid()
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
        what = "socket" if stat.S_ISSOCK(st.st_mode) else "non-socket file"
        raise UntrustedServer(
            f"overmind: {path} is a {what} owned by uid {st.st_uid}, not a socket of yours (uid {uid}); "
            f"another user may have planted it. Nothing was sent to it. Remove it, or set "
            f"OVERMIND_RUNTIME_DIR to a private directory of yours.")


def check_peer(sock: _socket.socket, path: str) -> int:
    """Return the server's pid if it runs as this user; else raise ``UntrustedServer``."""
    pid, uid, _gid = peer_credentials(sock)
    if uid != os.getuid():
        raise UntrustedServer(
            f"overmind: the process answering at {path} (pid {pid}) runs as uid {uid}, not as you (uid "
            f"{os.getuid()}); nothing was sent to it and nothing it sends is used. Its runtime directory may sit "
            f"in a directory other users can write: set OVERMIND_RUNTIME_DIR to a private directory of yours.")
    return pid
