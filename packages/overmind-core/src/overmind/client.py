"""The client side of the wire protocol: connect (or start) the server, send requests, hand back fds.

>>> client = get_client()
>>> res = client.get(key)                 # claim=True, wait=True
>>> if res.status == "claimed":           # this thread loads it, then publishes on the same connection
...     entry_id = client.publish(key, sealed_memfd, meta={"loader": "torch.load"})
... elif res.status == "hit":
...     fd = res.fds[res.entry["entry_id"]]   # the caller owns every fd in res.fds and closes it

Claims belong to a connection, so each thread gets its own connection (``threading.local``): the thread
that got ``claimed`` must ``publish`` or ``release`` itself. A forked child never reuses its parent's
connections. If the server died, a request reconnects once, starting a new server when ``autostart``.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import __version__, runtime
from .errors import ProtocolMismatch, ServerError, ServerUnavailable
from .protocol import PROTOCOL_VERSION, FrameError, close_fds, recv_message, send_message

_STOP_WAIT_S = 10.0


@dataclass
class GetResult:
    """Reply to ``Client.get``: ``status`` is ``hit``, ``claimed``, ``miss`` or ``busy``.

    On a hit, ``entry`` is ``{entry_id, key, nbytes, meta, deps}`` and ``fds`` maps the entry's id and the
    ids of every entry it transitively depends on to open fds that the caller owns and must close.
    """

    status: str
    entry: dict[str, Any] | None = None
    fds: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        """Close every fd of this result (when the caller does not keep them)."""
        close_fds(self.fds.values())
        self.fds = {}


class Client:
    """Talks to the server of one runtime directory; safe to share between threads and across fork."""

    def __init__(self, runtime_dir: str | None = None, autostart: bool = True) -> None:
        self.runtime_dir = runtime.runtime_dir(runtime_dir)
        self.socket_path = runtime.socket_path(self.runtime_dir)
        self.log_path = runtime.log_path(self.runtime_dir)
        self.autostart = autostart
        self.server_info: dict[str, Any] | None = None
        self._reset()

    # ---- public requests -------------------------------------------------------------------------------
    def get(self, key: str, *, claim: bool = True, wait: bool = True, timeout: float | None = None) -> GetResult:
        """Look ``key`` up: ``hit`` (with fds), ``claimed`` (you load it), ``miss`` or ``busy``."""
        reply, fds = self._request({"op": "get", "key": key, "claim": claim, "wait": wait, "timeout": timeout})
        if reply["status"] != "hit":
            close_fds(fds)
            return GetResult(reply["status"])
        return GetResult("hit", reply["entry"], self._pair(reply.get("fd_entries", []), fds))

    def publish(self, key: str, fd: int, *, deps: Iterable[str] = (), meta: dict[str, Any] | None = None) -> str:
        """Publish the sealed memfd ``fd`` (left open) as ``key``; returns the entry_id (an existing one if
        ``key`` was already published). Raises ``ServerError`` with ``reason`` ``not sealed``, ``dep missing``
        or ``budget``."""
        reply, fds = self._request({"op": "publish", "key": key, "deps": list(deps), "meta": meta or {}}, [fd])
        close_fds(fds)
        return reply["entry_id"]

    def release(self, key: str) -> bool:
        """Give up this thread's claim on ``key`` (the load failed) so a waiter can load it."""
        reply, fds = self._request({"op": "release", "key": key})
        close_fds(fds)
        return bool(reply.get("released"))

    def fds(self, entry_ids: Iterable[str]) -> dict[str, int]:
        """Fresh fds of ``entry_ids`` (caller closes them); ``ServerError`` if one is no longer cached."""
        ids = list(entry_ids)
        reply, fds = self._request({"op": "fds", "entry_ids": ids})
        return self._pair(reply.get("fd_entries", []), fds)

    def status(self) -> dict[str, Any]:
        """The server's status: pid, uptime, version, protocol, entries, bytes, max_bytes, clients, ..."""
        return self._plain({"op": "status"})

    def ls(self) -> list[dict[str, Any]]:
        """Every cached entry with its size, hits, last use, meta, deps and referents."""
        return self._plain({"op": "ls"})["entries"]

    def evict(self, key: str | None = None, all: bool = False) -> dict[str, Any]:
        """Evict ``key`` or everything; returns ``{"evicted": [keys], "refused": [{key, reason}]}``."""
        if not all and key is None:
            raise ValueError("evict needs a key or all=True")
        msg: dict[str, Any] = {"op": "evict", "all": True} if all else {"op": "evict", "key": key}
        return self._plain(msg)

    def stop(self) -> dict[str, Any]:
        """Ask the server to exit and wait until it has released its runtime directory.

        Never starts a server; raises ``ServerUnavailable`` if none is running.
        """
        conn = self._connection(autostart=False)
        try:
            send_message(conn, {"op": "stop"})
            reply, fds = recv_message(conn)
            close_fds(fds)
        except (OSError, FrameError) as exc:
            raise ServerUnavailable(f"overmind: the server went away while stopping ({exc}); see {self.log_path}")
        finally:
            self._drop_connection()
        _wait_server_gone(self.runtime_dir, self.socket_path)
        return {k: v for k, v in reply.items() if k != "ok"}

    def close(self) -> None:
        """Close every connection this process opened through this client."""
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # ---- connections -----------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()
        self._conns_lock = threading.Lock()
        self._conns: list[socket.socket] = []

    def _after_fork(self) -> None:
        # The child's copies of the parent's sockets must not be used (the parent's server state, claims
        # and replies are on them); closing the copies leaves the parent's connections untouched.
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        self._reset()

    def _connection(self, autostart: bool | None = None) -> socket.socket:
        if os.getpid() != self._pid:
            self._after_fork()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(self.autostart if autostart is None else autostart)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            return
        self._local.conn = None
        with self._conns_lock:
            if conn in self._conns:
                self._conns.remove(conn)
        conn.close()

    def _connect(self, autostart: bool) -> socket.socket:
        if autostart:
            from .server.launcher import ensure_server

            ensure_server(self.runtime_dir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            hint = ("it may have just exited; try again, or run 'overmind status'" if autostart else
                    "start one with 'overmind serve', or let overmind start it (autostart)")
            raise ServerUnavailable(
                f"overmind: no server accepts connections at {self.socket_path} ({exc.strerror}); {hint}."
            ) from None
        try:
            send_message(sock, {"op": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                                "version": __version__})
            reply, fds = recv_message(sock)
            close_fds(fds)
        except (OSError, FrameError) as exc:
            sock.close()
            raise ServerUnavailable(
                f"overmind: the server at {self.socket_path} closed the connection during hello ({exc}); "
                f"it may run as another user or be broken. See {self.log_path}."
            ) from None
        if not reply.get("ok") or reply.get("protocol") != PROTOCOL_VERSION:
            sock.close()
            if reply.get("reason") == "protocol" or reply.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolMismatch(reply.get("error") or (
                    f"overmind: the server speaks protocol {reply.get('protocol')!r}, this client "
                    f"{PROTOCOL_VERSION}. Run 'overmind stop' so a matching server starts."))
            raise ServerError(reply.get("error", "the server refused hello"), reply.get("reason"))
        self.server_info = {k: v for k, v in reply.items() if k != "ok"}
        return sock

    def _request(self, msg: dict[str, Any], fds: list[int] = ()) -> tuple[dict[str, Any], list[int]]:
        """Send ``msg`` on this thread's connection; reconnect once if the connection broke."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                send_message(conn, msg, fds)
                reply, got = recv_message(conn)
                break
            except (OSError, FrameError) as exc:
                # The server died or restarted. Claims on the old connection died with it, so repeating the
                # request on a fresh connection is the same as asking for the first time.
                self._drop_connection()
                if attempt == 2:
                    raise ServerUnavailable(
                        f"overmind: lost the connection to the server at {self.socket_path} ({exc}) twice. "
                        f"Run 'overmind status', and see {self.log_path}."
                    ) from None
        if not reply.get("ok"):
            close_fds(got)
            raise ServerError(f"overmind: {reply.get('error') or 'the server refused ' + repr(msg['op'])}",
                              reply.get("reason"))
        return reply, got

    def _plain(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply, fds = self._request(msg)
        close_fds(fds)
        return {k: v for k, v in reply.items() if k != "ok"}

    @staticmethod
    def _pair(ids: list[str], fds: list[int]) -> dict[str, int]:
        if len(ids) != len(fds):
            close_fds(fds)
            raise ServerError(f"overmind: the server sent {len(fds)} fds for {len(ids)} entries; the process "
                              f"may be at its open-file limit (ulimit -n).", "fd count")
        return dict(zip(ids, fds))


def _wait_server_gone(runtime_dir: str, socket_path: str) -> None:
    """Wait (bounded) until the server's lock is free, so an immediate restart cannot collide with it."""
    from .server.launcher import accepts, server_lock_free

    deadline = time.monotonic() + _STOP_WAIT_S
    while time.monotonic() < deadline:
        if not accepts(socket_path) and server_lock_free(runtime_dir):
            return
        time.sleep(0.02)


# ---- the per-process client --------------------------------------------------------------------------
_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def get_client() -> Client:
    """The shared ``Client`` of this process for the current runtime directory (``OVERMIND_RUNTIME_DIR``)."""
    directory = runtime.default_runtime_dir()
    with _clients_lock:
        client = _clients.get(directory)
        if client is None:
            client = _clients[directory] = Client(directory)
        return client


def _reinit_after_fork() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()  # another thread may have held it at fork time


os.register_at_fork(after_in_child=_reinit_after_fork)
