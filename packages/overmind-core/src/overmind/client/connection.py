"""The client side of the wire protocol (:class:`Client`, :func:`get_client`): connect to the server (or start it),
hello, requests and their fds. Every connection is closed at once in a forked child and before the interpreter's
teardown in any process (no ``ResourceWarning`` at exit); it never imports ``server/``.

>>> client = get_client()
>>> res = client.get(key)                 # claim=True, wait=True
>>> if res.status == "claimed":           # this thread loads it, then publishes on the same connection
...     res = client.publish_hit(key, sealed_memfd, meta={"loader": "torch.load"})   # answered like a hit
>>> fd = res.fds[res.entry["entry_id"]]   # the caller owns every fd in res.fds and closes it

Claims belong to a connection, so each thread gets its own connection (``threading.local``): the thread
that got ``claimed`` must ``publish`` or ``release`` itself.

A request is atomic from the caller's side. It either returns the reply to *that* request (every request
carries an id the reply must echo, and a ``get`` reply names its key), or it raises, and then the
connection is gone: whatever the server still had to say on it, and every claim it held, went with it (the
server releases a connection's claims when it closes). So an exception raised in the middle of a request
(Ctrl-C, a ``TimeoutError`` from the user's own signal handler) reaches the user unchanged and leaves
nothing behind for the next request to read. Every wait is bounded (``timeouts``): a server that does not
answer in time is dropped and the request raises ``ServerUnavailable``. The server must run as this user
(``peer``) before anything is sent to it. A forked child closes its copies of the parent's connections at
once (``os.register_at_fork``), so it never keeps the parent's claims alive; any process closes its own before
the interpreter tears down (``atexit``), which would otherwise report each as an unclosed socket. If the
connection broke (the server died), a request reconnects once, starting a new server when ``autostart``.
"""
from __future__ import annotations

import atexit
import itertools
import os
import socket
import stat
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable

from .._util import interrupts
from .._version import __version__
from ..errors import OvermindError, ProtocolMismatch, ServerError, ServerUnavailable
from ..ipc import ops, peer, runtime
from ..ipc.protocol import PROTOCOL_VERSION, ConnectionClosed, FrameError, close_fds, recv_message, send_message
from . import timeouts
from .transport import ReplyTimeout, TimedSocket, TransportError

_STOP_WAIT_S = 10.0
_GET_STATUSES = ("hit", "claimed", "miss", "busy", "refused")
# The connection is broken (peer gone, reset, garbage): the request may be repeated on a new connection.
# Only these, raised by protocol and transport themselves: an exception of the user's signal handler, even
# an OSError, is never taken for a broken connection and retried.
_BROKEN = (ConnectionClosed, TransportError, FrameError)


class _NoListener(ServerUnavailable):
    """Nothing listens at the socket (no file, or refused): with autostart, the server is started and asked again."""


class ReplyMismatch(ServerUnavailable):
    """The server answered something other than the request it was asked (a protocol error)."""


@dataclass
class GetResult:
    """Reply to ``Client.get``: ``status`` is ``hit``, ``claimed``, ``miss``, ``busy`` or ``refused``.

    On a hit, ``entry`` is ``{entry_id, key, nbytes, meta, deps}`` and ``fds`` maps the entry's id and the
    ids of every entry it transitively depends on to open fds that the caller owns and must close. When
    ``refused`` (the key's entry is larger than the whole budget), ``refusal`` says why, with its ``message``;
    when ``claimed``, ``room`` is what an entry may take before the publisher must ask ``admit``, and ``first``
    says that no load of the key left a mark in the server's life: its loader asks ``first_done`` before it
    publishes (admission by reuse, ``server/marks.py``).
    """

    status: str
    entry: dict[str, Any] | None = None
    fds: dict[str, int] = field(default_factory=dict)
    room: int | None = None  # claimed: the bytes an entry may take before its publisher must ask ``admit``
    refusal: dict[str, Any] | None = None  # refused: why, the sizes and the message (server/admission.py)
    first: bool = False  # claimed: the key's first load in the server's life (server/marks.py)

    def close(self) -> None:
        """Close every fd of this result (when the caller does not keep them)."""
        close_fds(self.fds.values())
        self.fds = {}


class Client:
    """Talks to the server of one runtime directory; safe to share between threads and across fork."""

    _conns: list[socket.socket]  # every connection this process opened (set by _reset)
    _conns_lock: threading.Lock

    def __init__(self, runtime_dir: str | None = None, autostart: bool = True, control: bool = False) -> None:
        """``control``: a client of the command or the inspection API, whose answers come within
        ``OVERMIND_CONTROL_TIMEOUT`` rather than ``OVERMIND_REPLY_TIMEOUT``."""
        self.runtime_dir = runtime.runtime_dir(runtime_dir)
        self.control = control
        self.socket_path = runtime.socket_path(self.runtime_dir)
        self.log_path = runtime.log_path(self.runtime_dir)
        self.autostart = autostart
        self.server_info: dict[str, Any] | None = None
        self._ids = itertools.count(1)
        self._reset()
        _all_clients.add(self)

    # ---- public requests -------------------------------------------------------------------------------
    def get(self, key: str, *, claim: bool = True, wait: bool = True, timeout: float | None = None,
            quiet: bool = False) -> GetResult:
        """Look ``key`` up: ``hit`` (with fds), ``claimed`` (you load it), ``miss`` or ``busy``.

        ``timeout`` bounds the wait on another process's claim (default ``OVERMIND_WAIT_TIMEOUT``). The first
        ask never waits, so a stopped server costs one reply timeout, not the whole wait. ``quiet``: a hit is not
        counted as a use of the entry (its hits, its place in the eviction order, ``status``'s counters): an
        ``overmind run`` template building ahead (``runner/prebuild.py``), not a load.
        """
        reply, fds = self._get_once(key, claim, None, quiet)
        try:
            if wait and reply["status"] == "busy":
                close_fds(fds)
                fds = []
                wait_s = timeouts.wait_timeout() if timeout is None else max(0.0, float(timeout))
                reply, fds = self._get_once(key, claim, wait_s, quiet)
            if reply["status"] != "hit":
                close_fds(fds)
                return GetResult(reply["status"], room=reply.get("room"), refusal=reply.get("refused"),
                                 first=reply.get("first") is True)
            return GetResult("hit", reply["entry"], self._pair(reply.get("fd_entries", []), fds))
        except (ReplyTimeout, *_BROKEN):
            close_fds(fds)
            self._drop_connection()
            raise
        except OvermindError:
            raise
        except BaseException:
            # Interrupted between two asks or after the answer: a claim it may have got must not outlive this.
            close_fds(fds)
            self._drop_connection()
            raise

    def claim_by_starting(self, key: str) -> bool:
        """With no server running, start one that holds ``key`` claimed for this process and return True: the key is
        a miss (a new server holds nothing) and this process's to load, at once, while the server starts
        (``launcher.start_holding``). False when this process has a connection, a server runs or one is starting:
        ask with :meth:`get`. Raises ``ServerUnavailable`` when no server can be spawned."""
        if os.getpid() != self._pid:
            self._after_fork()
        if not self.autostart or self._conns:
            return False
        if _is_socket_file(self.socket_path):
            try:
                self._connection(autostart=False)  # a server that listens is asked as usual, on this connection
                return False
            except _NoListener:
                pass  # its server is gone
        from .launcher import start_holding

        return start_holding(self.runtime_dir, key)

    def publish_hit(self, key: str, fd: int, *, deps: Iterable[str] = (), meta: dict[str, Any] | None = None,
                    files: Iterable[tuple[dict[str, Any], int]] = ()) -> GetResult:
        """Publish the sealed memfd ``fd`` (left open) as ``key``; the reply is a ``hit`` on the entry now
        serving ``key`` (an existing one if ``key`` was already published), with fds the caller owns, so a miss
        costs one round trip. Raises ``ServerError`` with ``reason`` ``not sealed``, ``dep missing`` or
        ``budget``, ``file changed``. ``files``: ``(description, read-only fd)`` of the checkpoint files the entry
        references (``shm.filemaps.open_referenced``), left open."""
        fields: dict[str, Any] = {"key": key, "deps": list(deps), "meta": meta or {}}
        files = list(files)
        if files:
            fields["files"] = [description for description, _ in files]
        reply, fds = self._call("publish", fields, [fd, *(file_fd for _, file_fd in files)])
        entry = reply.get("entry")
        if reply.get("status") != "hit" or reply.get("key") != key or not (
                isinstance(entry, dict) and entry.get("key") == key):
            close_fds(fds)
            self._drop_connection()
            raise ReplyMismatch(
                f"overmind: the server answered a publish of {key[:12]} with {_describe(reply)}, not a hit on the "
                f"entry; the connection was dropped. An older server may still run: run 'overmind stop'.")
        return GetResult("hit", entry, self._pair(reply.get("fd_entries", []), fds))

    def adopt(self, key: str, fd: int, meta: dict[str, Any],
              parts: Iterable[tuple[dict[str, Any], int]]) -> GetResult:
        """Hand the server an entry imported from the fleet (``server/imports.py``): ``fd`` its sealed
        memfd, ``parts`` ``({entry_id, kind, digest}, sealed memfd)`` of the blobs it depends on, all left
        open; answered like :meth:`publish_hit`."""
        parts = list(parts)
        reply, fds = self._call("adopt", {"key": key, "meta": meta,
                                          "parts": [about for about, _ in parts]},
                                [fd, *(part_fd for _, part_fd in parts)])
        entry = reply.get("entry")
        if reply.get("status") != "hit" or not (isinstance(entry, dict) and entry.get("key") == key):
            close_fds(fds)
            self._drop_connection()
            raise ReplyMismatch(f"overmind: the server answered an adopt of {key[:12]} with "
                                f"{_describe(reply)}, not a hit on the entry; the connection was "
                                f"dropped. An older server may still run: run 'overmind stop'.")
        return GetResult("hit", entry, self._pair(reply.get("fd_entries", []), fds))

    def publish(self, key: str, fd: int, *, deps: Iterable[str] = (), meta: dict[str, Any] | None = None) -> str:
        """Like :meth:`publish_hit`, but returns only the entry_id (the fds are closed)."""
        res = self.publish_hit(key, fd, deps=deps, meta=meta)
        res.close()
        assert res.entry is not None  # a publish is answered like a get hit
        return res.entry["entry_id"]

    def release(self, key: str) -> bool:
        """Give up this thread's claim on ``key`` (the load failed) so a waiter can load it.

        A claim lives on its connection: if that connection is already gone, so is the claim, and nothing is
        sent (no new connection is opened just to release nothing)."""
        if getattr(self._local, "conn", None) is None or os.getpid() != self._pid:
            return False
        return bool(self._plain("release", {"key": key}, retry=False).get("released"))

    def admit(self, key: str, nbytes: int) -> dict[str, Any]:
        """Whether the server can admit an entry of ``nbytes`` for ``key`` (``server/admission.py``): ``{"admitted":
        True}``, or the refusal with its ``message``. Asked before the entry is pickled and written."""
        return self._plain("admit", {"key": key, "nbytes": int(nbytes)})

    def first_done(self, key: str, nbytes: int, loader: str = "", summary: str = "") -> bool:
        """A first load of ``key`` ran under this thread's claim: whether to publish it (another process asked for
        it meanwhile, and waits for the entry). False: the server marked the key, with ``nbytes`` as its entry's
        estimated size (``loader`` and ``summary`` say what it is, for ``overmind ls``), and released the claim; the
        next load publishes (``server/marks.py``)."""
        reply = self._plain("first_done", {"key": key, "nbytes": int(nbytes), "loader": loader,
                                           "summary": summary})
        return bool(reply.get("publish"))

    # ---- mark_bad (server op 'bad', owned by the server side) ----
    def mark_bad(self, key: str, entry_id: str) -> bool:
        """Tell the server entry ``entry_id`` of ``key`` does not rebuild: it stops serving it (the next get
        is a claim, so the loader republishes) and frees it once no entry references it. False if that entry
        no longer serves ``key``."""
        return bool(self._plain("bad", {"key": key, "entry_id": entry_id}).get("marked"))
    # ---- end mark_bad ----

    def fds(self, entry_ids: Iterable[str]) -> dict[str, int]:
        """Fresh fds of ``entry_ids`` (caller closes them); ``ServerError`` if one is no longer cached."""
        ids = list(entry_ids)
        reply, fds = self._call("fds", {"entry_ids": ids})
        return self._pair(reply.get("fd_entries", []), fds)

    def blobs(self, keys: Iterable[str]) -> tuple[list[tuple[int, str, int]], dict[str, int]]:
        """Entries that may hold the bytes of blob ``keys`` (``overmind.entries.dedup``, which compares them):
        ``[(position in keys, entry_id, offset)]`` and an fd of each entry named (the caller closes them)."""
        reply, fds = self._call("blobs", {"keys": list(keys)})
        fd_map = self._pair(reply.get("fd_entries", []), fds)
        found = [tuple(f) for f in reply.get("found") or () if isinstance(f, list) and len(f) == 3]
        return found, fd_map

    def status(self) -> dict[str, Any]:
        """The server's status: pid, uptime, version, protocol, entries, bytes, max_bytes, clients, ..."""
        return self._plain("status", {})

    def ls(self) -> list[dict[str, Any]]:
        """Every cached entry with its size, hits, last use, meta, deps and referents."""
        return self._plain("ls", {})["entries"]

    def ls_all(self) -> dict[str, Any]:
        """The whole ``ls`` reply: ``entries`` as :meth:`ls`, and ``files``, the checkpoint files entries
        reference (``entry_id``, ``path``, ``nbytes``, ``referenced_by``, ``changed``), and ``marks``, the keys
        loaded once and not published (``key``, ``nbytes``, ``loader``, ``summary``, ``first_load``, ``last_load``,
        ``loads``: ``server/marks.py``)."""
        reply = self._plain("ls", {})
        return {"entries": reply["entries"], "files": reply.get("files", []), "marks": reply.get("marks", [])}

    def evict(self, key: str | None = None, all: bool = False) -> dict[str, Any]:
        """Evict ``key`` or everything; returns ``{"evicted": [keys], "refused": [{key, reason}]}``."""
        if not all and key is None:
            raise ValueError("evict needs a key or all=True")
        return self._plain("evict", {"all": True} if all else {"key": key})

    def stop(self) -> dict[str, Any]:
        """Ask the server to exit and wait until it has released its runtime directory.

        Never starts a server; raises ``ServerUnavailable`` if none is running.
        """
        self._connection(autostart=False)
        reply = self._plain("stop", {}, retry=False)
        self._drop_connection()
        _wait_server_gone(self.runtime_dir, self.socket_path)
        return reply

    def close(self) -> None:
        """Close every connection this process opened through this client."""
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # ---- one request -----------------------------------------------------------------------------------
    def call(self, op: str, /, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Ask the server ``op`` with ``fields``, checked against its row in ``overmind.ipc.ops``
        (``RequestError`` for a field left out or not declared there): the reply's fields and the
        fds it carried, which the caller owns and closes. A refusal raises ``ServerError`` with its
        ``reason``. The named requests above are this, with a typed answer.

        >>> reply, fds = client.call("status")
        """
        reply, fds = self._call(op, fields)
        return {k: v for k, v in reply.items() if k not in ("ok", "id")}, fds

    def _call(self, op: str, fields: dict[str, Any], fds: list[int] | tuple[()] = (), *,
              timeout: float | None = None, retry: bool = True) -> tuple[dict[str, Any], list[int]]:
        """:meth:`call` with the fds to send, the reply's deadline and whether to retry once on a
        new connection (:meth:`_request`); the reply as it came."""
        if op in ops.OPS and ops.OPS[op].daemon != ops.SERVER:
            raise ops.RequestError(f"{op!r} is an op of the {ops.OPS[op].daemon}, not the server's")
        return self._request(ops.request(op, **fields), fds, timeout=timeout, retry=retry)

    def _plain(self, op: str, fields: dict[str, Any], retry: bool = True) -> dict[str, Any]:
        """The reply's fields to a request that brings no fds back (any that come are closed)."""
        reply, fds = self._call(op, fields, retry=retry)
        close_fds(fds)
        return {k: v for k, v in reply.items() if k not in ("ok", "id")}

    def _get_once(self, key: str, claim: bool, wait_s: float | None,
                  quiet: bool = False) -> tuple[dict[str, Any], list[int]]:
        fields = {"key": key, "claim": claim, "wait": wait_s is not None, "timeout": wait_s}
        if quiet:
            fields["quiet"] = True
        # The server answers a waiting get within wait_s; one reply timeout more covers the trip.
        budget = None if wait_s is None else wait_s + timeouts.reply_timeout()
        reply, fds = self._call("get", fields, timeout=budget)
        status, entry = reply.get("status"), reply.get("entry")
        if (reply.get("key") != key or status not in _GET_STATUSES
                or (status == "hit" and not (isinstance(entry, dict) and entry.get("key") == key))):
            close_fds(fds)
            self._drop_connection()
            raise ReplyMismatch(
                f"overmind: the server answered a get of {key[:12]} with {_describe(reply)}; that is not an "
                f"answer to this request, so it was not used and the connection was dropped. If this repeats, "
                f"run 'overmind stop' and report it with {self.log_path}.")
        return reply, fds

    def _request(self, msg: dict[str, Any], fds: list[int] | tuple[()] = (), *, timeout: float | None = None,
                 retry: bool = True) -> tuple[dict[str, Any], list[int]]:
        """Send ``msg`` on this thread's connection and return the reply to it.

        Any exception drops the connection. A broken connection is retried once (when ``retry``) on a new
        one: the old one's claims died with it, so asking again is the same as asking for the first time.
        """
        request_id = next(self._ids)
        msg = dict(msg, id=request_id)
        seconds = self._reply_timeout() if timeout is None else timeout
        for attempt in (1, 2):
            conn = self._connection()
            try:
                reply, got = self._exchange(conn, msg, fds, seconds)
                break
            except _BROKEN as exc:
                self._drop_connection()
                if attempt == 2 or not retry:
                    raise ServerUnavailable(
                        f"overmind: lost the connection to the server at {self.socket_path} ({exc})"
                        f"{' twice' if attempt == 2 else ''}. Run 'overmind status', and see {self.log_path}."
                    ) from None
            except ReplyTimeout:
                self._drop_connection()
                raise ServerUnavailable(self._no_answer(msg["op"], seconds)) from None
            except BaseException:
                self._drop_connection()  # whatever the server still sends on it is never read
                raise
        try:
            if reply.get("id") != request_id:
                self._drop_connection()
                raise ReplyMismatch(
                    f"overmind: the server answered request {request_id} ({msg['op']}) with a reply to "
                    f"{reply.get('id')!r}; it was not used and the connection was dropped. If this repeats, "
                    f"run 'overmind stop' (an older server may still run) and see {self.log_path}.")
            if not reply.get("ok"):
                raise ServerError(f"overmind: {reply.get('error') or 'the server refused ' + repr(msg['op'])}",
                                  reply.get("reason"))
        except BaseException:
            close_fds(got)
            raise
        return reply, got

    @staticmethod
    def _exchange(conn: socket.socket, msg: dict[str, Any], fds: Iterable[int],
                  seconds: float) -> tuple[dict[str, Any], list[int]]:
        timed = TimedSocket(conn, seconds)
        send_message(timed, msg, fds)  # type: ignore[arg-type]
        return recv_message(timed)  # type: ignore[arg-type]

    def _no_answer(self, op: str, seconds: float) -> str:
        pid = (self.server_info or {}).get("server_pid", "?")
        return (f"overmind: the server (pid {pid}) did not answer '{op}' within {seconds:g} s; it may be "
                f"stopped (kill -STOP, Ctrl-Z on 'overmind serve', a debugger) or overloaded. The connection "
                f"was dropped. Resume or restart it ('overmind stop'), or raise "
                f"{timeouts.ENV_CONTROL if self.control else timeouts.ENV_REPLY}.")

    @staticmethod
    def _pair(ids: list[str], fds: list[int]) -> dict[str, int]:
        if len(ids) != len(fds):
            close_fds(fds)
            raise ServerError(f"overmind: the server sent {len(fds)} fds for {len(ids)} entries; the process "
                              f"may be at its open-file limit (ulimit -n).", "fd count")
        return dict(zip(ids, fds))

    # ---- connections -----------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()
        self._conns_lock = threading.Lock()
        self._conns = []

    def _after_fork(self) -> None:
        # The child's copies of the parent's sockets must not be used (the parent's claims and replies are on
        # them) nor kept open (a claim lives as long as any copy of its connection): close the copies, which
        # leaves the parent's connections untouched. The lock is not taken: another thread may have held it
        # at fork time.
        for conn in list(self._conns):
            try:
                conn.close()
            except OSError as exc:
                interrupts.raise_users(exc)
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

    def _reply_timeout(self) -> float:
        return timeouts.control_timeout() if self.control else timeouts.reply_timeout()

    def _connect(self, autostart: bool) -> socket.socket:
        seconds = self._reply_timeout()
        if autostart and not _is_socket_file(self.socket_path):
            _ensure_server(self.runtime_dir)  # no socket there (removed, or a file in its place): start or wait
        peer.check_socket_file(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            try:
                server_pid = self._open(sock, autostart)
            except _NoListener:
                # A socket nobody listens on (its server gone): start one (or wait for the one being started), then
                # connect again. A server that answers is used at once, with no probe connection before this one.
                sock.close()
                if not autostart:
                    raise
                _ensure_server(self.runtime_dir)
                peer.check_socket_file(self.socket_path)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                server_pid = self._open(sock, autostart)
            timed = TimedSocket(sock, seconds)
            hello = ops.request("hello", protocol=PROTOCOL_VERSION, pid=os.getpid(),
                                version=__version__)
            send_message(timed, hello)  # type: ignore[arg-type]
            reply, fds = recv_message(timed)  # type: ignore[arg-type]
            close_fds(fds)
        except ReplyTimeout:
            sock.close()
            self.server_info = {"server_pid": server_pid}
            raise ServerUnavailable(self._no_answer("hello", seconds)) from None
        except _BROKEN as exc:
            sock.close()
            raise ServerUnavailable(
                f"overmind: the server at {self.socket_path} closed the connection during hello ({exc}); "
                f"it may be broken or stopping. See {self.log_path}."
            ) from None
        except OvermindError:
            sock.close()
            raise
        except BaseException:
            sock.close()
            raise
        if not reply.get("ok") or reply.get("protocol") != PROTOCOL_VERSION:
            sock.close()
            if reply.get("reason") == "protocol" or reply.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolMismatch(reply.get("error") or (
                    f"overmind: the server speaks protocol {reply.get('protocol')!r}, this client "
                    f"{PROTOCOL_VERSION}. Run 'overmind stop' so a matching server starts."))
            raise ServerError(reply.get("error", "the server refused hello"), reply.get("reason"))
        self.server_info = {k: v for k, v in reply.items() if k not in ("ok", "id")}
        return sock

    def _open(self, sock: socket.socket, autostart: bool) -> int:
        """Connect ``sock`` without blocking and check who listens; returns the server's pid."""
        sock.setblocking(False)  # a stopped server's full backlog must not block connect()
        try:
            sock.connect(self.socket_path)
        except BlockingIOError:
            raise ServerUnavailable(
                f"overmind: the server at {self.socket_path} accepts no connections (its queue is full); it "
                f"may be stopped (kill -STOP, Ctrl-Z on 'overmind serve') or overloaded. Resume it or run "
                f"'overmind stop'.") from None
        except OSError as exc:
            interrupts.raise_users(exc)
            if exc.errno is None:
                raise
            hint = ("it may have just exited; try again, or run 'overmind status'" if autostart else
                    "start one with 'overmind serve', or let overmind start it (autostart)")
            raise _NoListener(
                f"overmind: no server accepts connections at {self.socket_path} ({exc.strerror}); {hint}."
            ) from None
        return peer.check_peer(sock, self.socket_path)


def _is_socket_file(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError as exc:
        interrupts.raise_users(exc)
        return False


def _ensure_server(runtime_dir: str) -> None:
    """Start the server if none runs; whatever goes wrong is a ``ServerUnavailable`` saying what and why."""
    from .launcher import ensure_server

    try:
        ensure_server(runtime_dir)
    except OvermindError:
        raise
    except Exception as exc:  # a launcher bug or an unforeseen OS refusal must not reach the user's load
        interrupts.raise_users(exc)
        raise ServerUnavailable(
            f"overmind: could not start the server for {runtime_dir} ({type(exc).__name__}: {exc}). "
            f"Run 'overmind doctor' to check the setup.") from exc


def _describe(reply: dict[str, Any]) -> str:
    shown = {k: reply.get(k) for k in ("id", "status", "key") if k in reply}
    return f"a reply {shown}" if shown else "a reply without a status"


def _wait_server_gone(runtime_dir: str, socket_path: str) -> None:
    """Wait (bounded) until the server's lock is free, so an immediate restart cannot collide with it."""
    from .launcher import accepts, server_lock_free

    deadline = time.monotonic() + _STOP_WAIT_S
    while time.monotonic() < deadline:
        if not accepts(socket_path) and server_lock_free(runtime_dir):
            return
        time.sleep(0.02)


# ---- the per-process client --------------------------------------------------------------------------
_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()
_all_clients: weakref.WeakSet[Client] = weakref.WeakSet()


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
    for client in list(_all_clients):
        client._after_fork()  # at once: a child that never uses overmind must not hold the parent's claims


def _close_at_exit() -> None:
    """Every connection this process opened is closed before the interpreter tears its modules down: a socket left
    to that teardown is reported as ``ResourceWarning: unclosed <socket ...>`` under ``-W default`` or ``-X dev``,
    where plain prints nothing. Each client is closed without its lock (a daemon thread may hold it as the
    interpreter exits); a thread that asks again afterwards connects anew."""
    for client in list(_all_clients):
        if os.getpid() != client._pid:
            client._after_fork()  # copies of a parent's connections: closed all the same, and nothing else
            continue
        conns, client._conns = client._conns, []
        client._local = threading.local()
        for conn in conns:
            with interrupts.suppress(OSError):
                conn.close()


os.register_at_fork(after_in_child=_reinit_after_fork)
atexit.register(_close_at_exit)
