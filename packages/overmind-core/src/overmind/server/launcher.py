"""Start the server on demand: ``ensure_server()`` returns a socket path that accepts connections.

Clients race to start the server; a flock on ``spawn.lock`` makes exactly one of them spawn it, and the
server's own flock on ``server.lock`` guards against everything else (a manual ``overmind serve``). The
server runs detached (its own session) so it outlives the process that started it.

>>> path = ensure_server()
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time

from .. import runtime
from ..errors import ServerUnavailable
from .daemon import EXIT_ALREADY_RUNNING

ENV_START_TIMEOUT = "OVERMIND_SERVER_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 15.0
_POLL_S = 0.02


def accepts(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket ``path`` right now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def ensure_server(runtime_dir: str | None = None, timeout: float | None = None) -> str:
    """Return the socket path of a running server for ``runtime_dir``, spawning one if none accepts.

    Raises ``ServerUnavailable`` (with the log's tail and what to do) if none is up within ``timeout``
    seconds (default ``$OVERMIND_SERVER_START_TIMEOUT`` or 15).
    """
    directory = runtime.runtime_dir(runtime_dir)
    path = runtime.socket_path(directory)
    if accepts(path):
        return path
    if timeout is None:
        timeout = float(os.environ.get(ENV_START_TIMEOUT) or DEFAULT_START_TIMEOUT)
    deadline = time.monotonic() + timeout
    lock_fd = os.open(runtime.spawn_lock_path(directory), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not _lock_until(lock_fd, deadline):
            if accepts(path):
                return path
            raise _unavailable(directory, f"another process has been starting the server for {timeout:g} s")
        return _start_and_wait(directory, path, deadline, timeout)
    finally:
        os.close(lock_fd)  # releases the flock


def _start_and_wait(directory: str, path: str, deadline: float, timeout: float) -> str:
    """With the spawn lock held: spawn a server unless one is up or on its way, then wait until it accepts."""
    proc: subprocess.Popen | None = None
    try:
        while time.monotonic() < deadline:
            if accepts(path):
                return path
            if proc is not None and proc.poll() is not None:
                if proc.returncode != EXIT_ALREADY_RUNNING:
                    raise _unavailable(directory, f"the server process exited with status {proc.returncode}")
                proc = None  # another server holds the lock: wait for it to accept, or to finish stopping
            # A server that holds its lock but does not accept is starting or stopping: wait, don't spawn.
            if proc is None and server_lock_free(directory):
                proc = _spawn(directory)
            time.sleep(_POLL_S)
        raise _unavailable(directory, f"the server did not accept connections within {timeout:g} s "
                                      f"(raise {ENV_START_TIMEOUT} if the machine is very busy)")
    finally:
        if proc is not None:
            # Reap the server when it eventually exits so it does not linger as a zombie of this process.
            threading.Thread(target=proc.wait, name="overmind-server-reaper", daemon=True).start()


def server_lock_free(runtime_dir: str | None = None) -> bool:
    """Whether no server process holds the runtime directory's server lock (none running or starting)."""
    fd = os.open(runtime.server_lock_path(runtime_dir), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _lock_until(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _spawn(directory: str) -> subprocess.Popen:
    log_file = runtime.log_path(directory)
    env = dict(os.environ)
    # The server must import the same overmind as this client, even one found via sys.path tweaks rather
    # than installed into sys.executable's environment.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "overmind.server", "--runtime-dir", directory],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
            env=env, cwd="/",
        )
    return proc


def _unavailable(directory: str, why: str) -> ServerUnavailable:
    log_file = runtime.log_path(directory)
    return ServerUnavailable(
        f"overmind: could not start the server for {directory}: {why}.\n"
        f"Last lines of {log_file}:\n{log_tail(log_file)}\n"
        f"Run 'overmind serve' in a terminal to see the error, or 'overmind doctor' to check the setup."
    )


def log_tail(path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` (indented), or a note that it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"  (cannot read the log: {exc.strerror})"
    tail = text.splitlines()[-lines:]
    return "\n".join("  " + line for line in tail) if tail else "  (the log is empty)"


def server_pids(runtime_dir: str) -> list[int]:
    """Pids of live ``overmind.server`` processes whose command line names exactly ``runtime_dir``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"overmind.server" in argv and os.fsencode(runtime_dir) in argv:
            pids.append(int(name))
    return pids
