"""The server process: single-instance lock, listening socket, one event loop, orderly shutdown.

One thread serves every connection through a selector, so a thread limit (RLIMIT_NPROC, a pids cgroup)
cannot end the server and a thousand idle clients cost a thousand sockets, not a thousand threads. Nothing
in the loop blocks: requests are read incrementally (``wire``), replies are queued and sent as the socket
takes them, and a ``get`` waiting on another client's claim is parked until the key is published or
released. A few times a second the loop also enforces the hello, frame and idle timeouts (``limits``) and
checks that the runtime directory, lock and socket are still its own (``watch``).

The server imports only the standard library and ``overmind.ipc.protocol``/``runtime``/``errors``/``shm.seals``:
it never imports torch and never unpickles client data, so a client cannot make it run code and it starts in
a fraction of a second.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import resource
import selectors
import signal
import socket
import threading
import time

from ..errors import OvermindError
from ..ipc import runtime
from ..ipc.peer import peer_credentials
from ..ipc.protocol import ConnectionClosed, FrameError
from . import lineage, watch
from .connection import Connection
from .handoff import SpawnerClaim
from .limits import Limits
from .log import INFO, WARNING, log
from .store import Store, process_owner
from .uploads import Uploader
from .wire import BufferBudget, FrameReader

WATCH_EVERY_S = 0.25  # how often the runtime directory is checked (a client waits at most about this long)
_ACCEPT_BACKOFF_S = 0.1  # after accept() fails (EMFILE, ENOMEM): stop accepting this long
_STOP_FLUSH_S = 1.0  # at shutdown, how long queued replies (the 'stop' reply) may take to go out
_LISTENER_FD = 8192  # see _above_connections


class AlreadyRunning(OvermindError):
    """Another server holds the runtime directory's lock."""


class Server:
    """``Server(runtime_dir, max_bytes).serve_forever()`` serves until ``stop``, SIGTERM or SIGINT.

    ``spawner_claim``: ``(key, pid)``, the key its parent loads while it starts (``handoff.py``), claimed for
    that process before the server listens."""

    def __init__(self, runtime_dir: str, max_bytes: int, limits: Limits | None = None,
                 spawner_claim: tuple[str, int] | None = None) -> None:
        self.runtime_dir = runtime.runtime_dir(runtime_dir)
        self.socket_file = runtime.socket_path(self.runtime_dir)
        self.log_file = runtime.log_path(self.runtime_dir)
        self.limits = limits or Limits.from_env()
        self.store = Store(max_bytes)
        self.uploads = Uploader()  # to the fleet's store, where OVERMIND_FLEET is set (uploads.py)
        self.store.on_publish = self.uploads.on_publish
        self.buffer_budget = BufferBudget(self.limits.max_buffered_bytes)
        self.started = time.monotonic()
        self.clients = 0
        self.last_lost: dict | None = None  # when the cache was last lost (lineage.py), for status
        self._stopping = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._socket_identity: watch.Identity | None = None
        self._lock_file: int | None = None
        self._watch = watch.RuntimeWatch(self.runtime_dir)
        self._conns: dict[int, Connection] = {}  # by conn_id
        self._events: dict[int, int] = {}  # conn_id -> selector events registered (absent: none)
        self._waiters: dict[str, list[Connection]] = {}  # key -> connections parked on its claim, FIFO
        self._parked: list[Connection] = []  # readers waiting for room in the buffer budget
        self._accept_resume = 0.0
        self._next_watch = 0.0
        self._ids = itertools.count(1)
        self._spawner_claim = spawner_claim
        self._spawner: SpawnerClaim | None = None

    def serve_forever(self) -> None:
        """Take the lock, hold the spawner's claim, bind, serve until asked to stop, then clean up."""
        self._take_lock()
        try:
            _raise_fd_limit()
            self._hold_spawner_claim()  # before the socket exists: nobody can ask for the key first
            self._bind()
            self._install_signal_handlers()
            previous, self.last_lost = lineage.started(self.runtime_dir, os.getpid())
            said = lineage.describe_previous(previous)
            if said:
                log.log(INFO if previous and previous.get("ended") == "clean" else WARNING, "%s", said)
            log.info("server pid %d serving %s (budget %d bytes)", os.getpid(), self.socket_file,
                     self.store.max_bytes)
            _notify_ready(self.socket_file)
            self._loop()
        finally:
            self._shutdown()

    def request_stop(self, why: str) -> None:
        """Make the loop end within a tick (safe from a signal handler)."""
        if self._stopping.is_set():
            return
        log.info("stopping: %s", why)
        self._stopping.set()

    def client_count(self, delta: int) -> None:
        """Track connected (hello'd) clients for ``status``."""
        self.clients += delta

    def start_waiting(self, conn: Connection) -> None:
        assert conn.waiting is not None
        self._waiters.setdefault(conn.waiting.key, []).append(conn)

    def stop_waiting(self, conn: Connection) -> None:
        for key, queue in list(self._waiters.items()):
            if conn in queue:
                queue.remove(conn)
                if not queue:
                    del self._waiters[key]

    def waiting_count(self) -> int:
        """Requests parked on another connection's claim (reported by ``status``)."""
        return sum(len(q) for q in self._waiters.values())

    # ---- the spawner's claim (handoff.py) ---------------------------------------------------------------
    def _hold_spawner_claim(self) -> None:
        if self._spawner_claim is None:
            return
        key, pid = self._spawner_claim
        spawner = SpawnerClaim.take(key, pid)
        if spawner is None:
            return
        self.store.hold_for_process(key, pid)
        self._spawner = spawner
        self._sel.register(spawner, selectors.EVENT_READ, spawner)
        log.info("holding key %s for pid %d, which started this server and loads it", key[:12], pid)

    def _spawner_exited(self, spawner: SpawnerClaim) -> None:
        self._drop_spawner()
        self.store.release_all(process_owner(spawner.pid), f"pid {spawner.pid}, which started the server,")

    def _drop_spawner(self) -> None:
        if self._spawner is not None:
            self._sel.unregister(self._spawner)
            self._spawner.close()
            self._spawner = None

    # ---- lock and socket -------------------------------------------------------------------------------
    def _take_lock(self) -> None:
        path = runtime.server_lock_path(self.runtime_dir)
        fd = watch.take_lock(path)
        if fd is None:
            try:
                with open(path, "rb") as f:
                    holder = f.read(32).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise AlreadyRunning(
                f"overmind server: another server (pid {holder}) already serves {self.runtime_dir}; this one "
                f"exits. Use 'overmind status' to inspect it or 'overmind stop' to stop it first."
            )
        self._lock_file = fd

    def _bind(self) -> None:
        # We hold the lock, so no other server uses this socket: any file there is stale.
        try:
            os.unlink(self.socket_file)
            log.info("removed stale socket %s", self.socket_file)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # the socket is born 0600, with no window of wider access
        try:
            listener.bind(self.socket_file)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_file, 0o600)
        listener = _above_connections(listener)
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        self._socket_identity = watch.identity(self.socket_file)
        self._listener = listener
        self._accept_resume = 0.0
        self._sel.register(listener, selectors.EVENT_READ, None)

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._sel.unregister(self._listener)
            except (KeyError, ValueError):
                pass
            self._listener.close()
            self._listener = None

    def _check_runtime_dir(self) -> None:
        assert self._lock_file is not None
        verdict = self._watch.verdict(self._lock_file, self._socket_identity)
        if verdict == watch.DIR_GONE:
            self.request_stop(f"the runtime directory {self.runtime_dir} was removed or replaced; exiting (and "
                              f"freeing every entry) so that a new server can start there")
            return
        if verdict == watch.LOCK_LOST:
            fd = watch.take_lock(self._watch.lock_file, tries=10)
            if fd is None:
                self.request_stop(f"the lock file of {self.runtime_dir} was replaced and another server holds "
                                  f"the new one; exiting in its favour")
                return
            os.close(self._lock_file)
            self._lock_file = fd
            log.warning("the lock file %s was removed; took the lock again", self._watch.lock_file)
            verdict = self._watch.verdict(self._lock_file, self._socket_identity)
        if verdict == watch.SOCKET_LOST:
            self._close_listener()
            try:
                self._bind()
            except OSError as exc:
                self.request_stop(f"the socket {self.socket_file} was removed and cannot be created again "
                                  f"({exc.strerror}); exiting so that a new server can start")
                return
            log.warning("the socket %s was removed or replaced (a tmp cleaner?); re-created the socket",
                        self.socket_file)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.request_stop(f"signal {signal.Signals(signum).name}"))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    # ---- the loop --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            for key, mask in self._sel.select(self._select_timeout()):
                if key.data is None:
                    self._accept()
                elif isinstance(key.data, SpawnerClaim):
                    self._spawner_exited(key.data)
                else:
                    self._service(key.data, readable=bool(mask & selectors.EVENT_READ))
            self._settle()
            self._tick()

    def _select_timeout(self) -> float:
        now = time.monotonic()
        soonest = self._next_watch
        for queue in self._waiters.values():
            for conn in queue:
                if conn.waiting is not None and conn.waiting.deadline is not None:
                    soonest = min(soonest, conn.waiting.deadline)
        return max(0.0, min(WATCH_EVERY_S, soonest - now))

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE, ENFILE, ENOBUFS, ENOMEM: refuse by not accepting for a moment instead of spinning.
                log.warning("accept failed (%s); not accepting for %.1f s", exc, _ACCEPT_BACKOFF_S)
                self._sel.unregister(self._listener)
                self._accept_resume = time.monotonic() + _ACCEPT_BACKOFF_S
                return
            try:
                sock.setblocking(False)
                pid, uid, _gid = peer_credentials(sock)
            except OSError as exc:
                log.info("dropped a connection that failed at once: %s", exc)
                sock.close()
                continue
            if uid != os.getuid():
                log.warning("refused connection from pid %d: it runs as uid %d, this server serves only uid %d "
                            "(the runtime directory should not be reachable by other users; check its mode)",
                            pid, uid, os.getuid())
                sock.close()
                continue
            conn = Connection(self, sock, next(self._ids), pid)
            self._conns[conn.conn_id] = conn
            self._interest(conn)

    def _service(self, conn: Connection, readable: bool) -> None:
        """Move ``conn`` forward as far as it goes now: send replies, handle requests, read what arrived."""
        try:
            while True:
                if conn.outbox and not conn.outbox.flush(conn.sock):
                    break
                if conn.closing:
                    self._close(conn, None)
                    return
                if conn.pending is not None and conn.waiting is None:
                    conn.advance()
                    continue
                if readable and conn.wants_read:
                    got = conn.reader.read()
                    if got is None:
                        break
                    if got is FrameReader.PARKED:
                        conn.parked = True
                        self._parked.append(conn)
                        break
                    conn.take(got)  # type: ignore[arg-type]  # a request: PARKED is handled above
                    continue
                break
        except ConnectionClosed:
            self._close(conn, None)
            return
        except FrameError as exc:
            self._close(conn, f"closing {conn}: {exc}", WARNING)
            return
        except OSError as exc:
            self._close(conn, f"{conn} failed: {exc}")
            return
        except Exception:
            log.exception("%s crashed; it is closed and its claims are released", conn)
            self._close(conn, None)
            return
        self._interest(conn)

    def _interest(self, conn: Connection) -> None:
        if conn.conn_id not in self._conns:
            return
        want = (selectors.EVENT_READ if conn.wants_read else 0) | (selectors.EVENT_WRITE if conn.outbox else 0)
        have = self._events.get(conn.conn_id)
        if want == (have or 0):
            return
        if not want:
            self._sel.unregister(conn.sock)
            del self._events[conn.conn_id]
        elif have is None:
            self._sel.register(conn.sock, want, conn)
            self._events[conn.conn_id] = want
        else:
            self._sel.modify(conn.sock, want, conn)
            self._events[conn.conn_id] = want

    def _close(self, conn: Connection, why: str | None, level: int = INFO) -> None:
        if self._conns.pop(conn.conn_id, None) is None:
            return
        if why:
            log.log(level, "%s", why)
        if self._events.pop(conn.conn_id, None) is not None:
            self._sel.unregister(conn.sock)
        if conn in self._parked:
            self._parked.remove(conn)
        self.stop_waiting(conn)
        conn.discard()
        self.store.release_all(conn.conn_id, repr(conn))
        if conn.greeted:
            self.client_count(-1)
        conn.sock.close()

    def _settle(self) -> None:
        """Answer the parked gets whose key was published or released, until nothing else changes."""
        changed = self.store.take_changed()
        while changed:
            for key in changed:
                for conn in list(self._waiters.get(key, ())):
                    if conn.conn_id in self._conns and conn.waiting is not None and conn.retry():
                        self._service(conn, readable=False)
            changed = self.store.take_changed()

    def _tick(self) -> None:
        now = time.monotonic()
        if self._listener is not None and self._accept_resume and now >= self._accept_resume:
            self._accept_resume = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)
        for queue in list(self._waiters.values()):
            for conn in list(queue):
                if conn.waiting is not None and conn.waiting.deadline is not None and now >= conn.waiting.deadline:
                    conn.expire()
                    self._service(conn, readable=False)
        if self._parked:
            parked, self._parked = self._parked, []
            for conn in parked:
                conn.parked = False
                self._service(conn, readable=True)
        self._settle()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_EVERY_S
        limits = self.limits
        for conn in list(self._conns.values()):
            if not conn.greeted and now - conn.accepted > limits.hello_timeout:
                self._close(conn, f"closing {conn}: no hello within {limits.hello_timeout:g} s")
            elif conn.reader.started is not None and now - conn.reader.started > limits.frame_timeout:
                self._close(conn, f"closing {conn}: a frame begun {limits.frame_timeout:g} s ago is still "
                            f"incomplete", WARNING)
            elif not conn.busy and now - conn.last_active > limits.idle_timeout:
                self._close(conn, f"closing {conn}: idle for {limits.idle_timeout:g} s and holding nothing")
        self._settle()
        self._check_runtime_dir()

    def _shutdown(self) -> None:
        self._flush_for_stop()
        for conn in list(self._conns.values()):
            self._close(conn, None)
        self._close_listener()
        self._drop_spawner()
        if self._socket_identity is not None and watch.identity(self.socket_file) == self._socket_identity:
            try:
                os.unlink(self.socket_file)
            except FileNotFoundError:
                pass
        self.store.close_all()
        if self._lock_file is not None:
            lineage.stopped(self.runtime_dir)
            # Releasing the lock last: a new server may only bind once our socket is gone.
            os.close(self._lock_file)
            self._lock_file = None
        log.info("server pid %d stopped", os.getpid())

    def _flush_for_stop(self) -> None:
        deadline = time.monotonic() + _STOP_FLUSH_S
        for conn in list(self._conns.values()):
            while conn.outbox and time.monotonic() < deadline:
                try:
                    if not conn.outbox.flush(conn.sock):
                        time.sleep(0.005)
                except (ConnectionClosed, OSError):
                    break


def _above_connections(listener: socket.socket) -> socket.socket:
    """``listener`` moved to a high fd number, above the fds of connections and entries.

    When the server dies (SIGKILL, a crash) Linux releases its files highest fd first (task work runs last
    in, first out); with the listener highest, the socket refuses connections before any client sees its connection
    end, so a client that reconnects at once gets ECONNREFUSED (and starts a new server) instead of being
    queued in a dying backlog and reset during hello. Where the fd cannot be moved, nothing changes.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(_LISTENER_FD, soft - 1) if soft != resource.RLIM_INFINITY else _LISTENER_FD
    try:
        high = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD_CLOEXEC, target)
    except OSError:
        return listener
    listener.close()
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=high)


def _notify_ready(socket_file: str) -> None:
    """Tell the service manager that started this server (systemd's ``Type=notify``) that it accepts connections:
    ``READY=1`` on the datagram socket ``$NOTIFY_SOCKET`` names (a path, or ``@`` for an abstract name). Nothing
    when the variable is unset. The variable is taken out of the environment, so that no process this one starts
    (the ``overmind run`` template) speaks for the service."""
    address = os.environ.pop("NOTIFY_SOCKET", "")
    if address[:1] not in ("/", "@"):
        return
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as notify:
            notify.connect(address)
            notify.sendall(f"READY=1\nSTATUS=serving {socket_file}".encode())
    except OSError as exc:
        log.warning("could not tell the service manager that the server is ready (NOTIFY_SOCKET %s: %s)",
                    address.lstrip("\0"), exc)


def _raise_fd_limit() -> None:
    """Lift the soft open-file limit to the hard one: the server holds one fd per entry plus one per client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d (%s); at most about %d entries and clients "
                        "fit at once", soft, exc, soft)
