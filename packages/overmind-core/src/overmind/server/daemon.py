"""The server process: single-instance lock, listening socket, accept loop, orderly shutdown.

One thread per connection, no client limit. The server imports only the standard library and
``overmind.protocol``/``runtime``/``errors``: it never imports torch and never unpickles client data, so
a client cannot make it run code and it starts in a fraction of a second.
"""
from __future__ import annotations

import fcntl
import itertools
import logging
import os
import resource
import signal
import socket
import threading
import time

from .. import runtime
from ..errors import OvermindError
from .connection import Connection
from .entries import Store

log = logging.getLogger("overmind.server")
# Exit status of a server that found another one holding the lock; the launcher then waits for that one.
EXIT_ALREADY_RUNNING = 3


class AlreadyRunning(OvermindError):
    """Another server holds the runtime directory's lock."""


class Server:
    """``Server(runtime_dir, max_bytes).serve_forever()`` serves until ``stop``, SIGTERM or SIGINT."""

    def __init__(self, runtime_dir: str, max_bytes: int) -> None:
        self.runtime_dir = runtime.runtime_dir(runtime_dir)
        self.socket_file = runtime.socket_path(self.runtime_dir)
        self.log_file = runtime.log_path(self.runtime_dir)
        self.store = Store(max_bytes)
        self.started = time.monotonic()
        self.clients = 0
        self._clients_lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._lock_file: int | None = None
        self._ids = itertools.count(1)

    def serve_forever(self) -> None:
        """Take the lock, bind, accept until asked to stop, then clean up."""
        self._take_lock()
        try:
            _raise_fd_limit()
            self._bind()
            self._install_signal_handlers()
            log.info("server pid %d serving %s (budget %d bytes)", os.getpid(), self.socket_file,
                     self.store.max_bytes)
            self._accept_loop()
        finally:
            self._shutdown()

    def request_stop(self, why: str) -> None:
        """Make the accept loop end (safe from any thread and from a signal handler)."""
        if self._stopping.is_set():
            return
        log.info("stopping: %s", why)
        self._stopping.set()
        listener = self._listener
        if listener is not None:
            try:
                # On Linux, shutting down a listening socket wakes a thread blocked in accept().
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def client_count(self, delta: int) -> None:
        """Track connected (hello'd) clients for ``status``."""
        with self._clients_lock:
            self.clients += delta

    # ---- internals -------------------------------------------------------------------------------------
    def _take_lock(self) -> None:
        path = runtime.server_lock_path(self.runtime_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"overmind server: another server (pid {holder}) already serves {self.runtime_dir}; this one "
                f"exits. Use 'overmind status' to inspect it or 'overmind stop' to stop it first."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_file = fd

    def _bind(self) -> None:
        # We hold the lock, so no other server uses this socket: any file there is stale.
        try:
            os.unlink(self.socket_file)
            log.info("removed stale socket %s", self.socket_file)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600, with no window of wider access
        try:
            listener.bind(self.socket_file)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_file, 0o600)
        listener.listen(socket.SOMAXCONN)
        self._socket_ino = os.stat(self.socket_file).st_ino
        self._listener = listener

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.request_stop(f"signal {signal.Signals(signum).name}"))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:
                if self._stopping.is_set():
                    break
                log.warning("accept failed: %s", exc)
                time.sleep(0.05)  # e.g. EMFILE: back off instead of spinning
                continue
            conn = Connection(self, sock, next(self._ids))
            threading.Thread(target=conn.run, name=f"conn-{conn.conn_id}", daemon=True).start()

    def _shutdown(self) -> None:
        if self._listener is not None:
            self._listener.close()
            try:
                if os.stat(self.socket_file).st_ino == self._socket_ino:
                    os.unlink(self.socket_file)
            except FileNotFoundError:
                pass
        self.store.close_all()
        if self._lock_file is not None:
            # Releasing the lock last: a new server may only bind once our socket is gone.
            os.close(self._lock_file)
            self._lock_file = None
        log.info("server pid %d stopped", os.getpid())


def _raise_fd_limit() -> None:
    """Lift the soft open-file limit to the hard one: the server holds one fd per entry plus one per client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d (%s); at most about %d entries and clients "
                        "fit at once", soft, exc, soft)
