"""Where the server lives: the per-user runtime directory (its resolution and permissions) and the paths inside it.

The directory is the security boundary before SO_PEERCRED: mode 0700 and owned by the user, so no other
user can even reach the socket. A directory that fails either check is refused, never silently "fixed",
because someone else may have planted it.

>>> runtime_dir()                # $OVERMIND_RUNTIME_DIR, $XDG_RUNTIME_DIR/overmind, or /tmp/overmind-<uid>
'/run/user/1000/overmind'
>>> socket_path()
'/run/user/1000/overmind/server.sock'
"""
from __future__ import annotations

import os
import stat

from .._util import interrupts
from ..errors import RuntimeDirError

ENV_RUNTIME_DIR = "OVERMIND_RUNTIME_DIR"
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


def default_runtime_dir() -> str:
    """The runtime directory to use when none is given, without creating or checking it."""
    from ..settings import current

    explicit = current().runtime_dir
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "overmind")
    return f"/tmp/overmind-{os.getuid()}"


def runtime_dir(path: str | None = None, *, create: bool = True) -> str:
    """Return the checked runtime directory (``path`` or the default), creating it with mode 0700.

    Raises ``RuntimeDirError`` if it belongs to another user or grants group/other permissions.
    """
    path = os.path.abspath(path) if path else default_runtime_dir()
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except FileExistsError:
            check_runtime_dir(path)  # a file or a dangling symlink is there: say so, not "File exists"
            raise
        except OSError as exc:
            interrupts.raise_users(exc)
            raise RuntimeDirError(
                f"overmind: cannot create the runtime directory {path}: {exc.strerror}. "
                f"Set {ENV_RUNTIME_DIR} to a writable directory of yours."
            ) from None
    check_runtime_dir(path)
    return path


def check_runtime_dir(path: str) -> None:
    """Raise ``RuntimeDirError`` unless ``path`` is a real directory of this user with mode 0700 or less."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RuntimeDirError(
            f"overmind: the runtime directory {path} does not exist. It is created on first use; "
            f"check that its parent is writable or set {ENV_RUNTIME_DIR}."
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(
            f"overmind: the runtime directory {path} is not a directory (a symlink or file is there). "
            f"Remove it or set {ENV_RUNTIME_DIR} to another path."
        )
    uid = os.getuid()
    if st.st_uid != uid:
        raise RuntimeDirError(
            f"overmind: the runtime directory {path} belongs to uid {st.st_uid}, not to you (uid {uid}); "
            f"another user may have planted it. Remove it or set {ENV_RUNTIME_DIR} to a directory of yours."
        )
    if st.st_mode & 0o077:
        raise RuntimeDirError(
            f"overmind: the runtime directory {path} has mode {stat.S_IMODE(st.st_mode):04o}, which lets "
            f"other users reach the server. Run 'chmod 700 {path}'."
        )


def socket_path(path: str | None = None) -> str:
    """The server's Unix socket inside the runtime directory (created and checked)."""
    sock = os.path.join(runtime_dir(path), "server.sock")
    if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
        raise RuntimeDirError(
            f"overmind: the socket path {sock} is longer than the {_MAX_SOCKET_PATH} bytes a Unix socket "
            f"allows. Set {ENV_RUNTIME_DIR} to a shorter directory."
        )
    return sock


def log_path(path: str | None = None) -> str:
    """The server's log file inside the runtime directory."""
    return os.path.join(runtime_dir(path), "server.log")


def server_lock_path(path: str | None = None) -> str:
    """The file the running server holds an exclusive flock on for its whole life."""
    return os.path.join(runtime_dir(path), "server.lock")


# Exit status of a server that found another one holding the server lock; the launcher then waits for that one.
EXIT_ALREADY_RUNNING = 3


def spawn_lock_path(path: str | None = None) -> str:
    """The file clients flock while deciding whether to spawn a server, so only one spawns."""
    return os.path.join(runtime_dir(path), "spawn.lock")
