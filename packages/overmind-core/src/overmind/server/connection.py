"""One client connection of the server: peer check, hello, then one request at a time until it closes.

Each connection runs in its own thread. The handler only validates requests and turns them into calls on
the ``Store``; it never unpickles or interprets client data beyond the JSON of the request.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..protocol import PROTOCOL_VERSION, ConnectionClosed, FrameError, close_fds, recv_message, send_message
from .entries import StoreError

if TYPE_CHECKING:
    from .daemon import Server

log = logging.getLogger("overmind.server")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class BadRequest(StoreError):
    """A request with missing or ill-typed fields."""

    def __init__(self, message: str) -> None:
        super().__init__("bad request", message)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end, as the kernel saw it when it connected."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(raw)


class Connection:
    """Serves one accepted socket; ``run`` returns when the client goes away or asks the server to stop."""

    def __init__(self, server: "Server", sock: socket.socket, conn_id: int) -> None:
        self.server = server
        self.store = server.store
        self.sock = sock
        self.conn_id = conn_id
        self.peer_pid = -1

    def run(self) -> None:
        """Check the peer, require hello, then answer requests; always releases this connection's claims."""
        counted = False
        try:
            pid, uid, _gid = peer_credentials(self.sock)
            self.peer_pid = pid
            if uid != os.getuid():
                log.warning("refused connection from pid %d: it runs as uid %d, this server serves only uid %d "
                            "(the runtime directory should not be reachable by other users; check its mode)",
                            pid, uid, os.getuid())
                return
            if not self._hello():
                return
            self.server.client_count(+1)
            counted = True
            while self._serve_one():
                pass
        except ConnectionClosed:
            pass
        except FrameError as exc:
            log.warning("closing connection %d (pid %d): %s", self.conn_id, self.peer_pid, exc)
        except OSError as exc:
            log.info("connection %d (pid %d) failed: %s", self.conn_id, self.peer_pid, exc)
        except Exception:
            log.exception("connection %d (pid %d) crashed; its claims are released", self.conn_id, self.peer_pid)
        finally:
            self.store.release_all(self.conn_id, f"connection {self.conn_id} (pid {self.peer_pid})")
            if counted:
                self.server.client_count(-1)
            self.sock.close()

    def _hello(self) -> bool:
        msg, fds = recv_message(self.sock)
        close_fds(fds)
        if msg.get("op") != "hello":
            self._reply({"ok": False, "reason": "bad request",
                         "error": "the first request on a connection must be 'hello'; use overmind.client"})
            return False
        theirs = msg.get("protocol")
        if theirs != PROTOCOL_VERSION:
            log.warning("refused pid %d: it speaks protocol %r, this server speaks %d", self.peer_pid, theirs,
                        PROTOCOL_VERSION)
            self._reply({
                "ok": False, "reason": "protocol", "protocol": PROTOCOL_VERSION, "server_pid": os.getpid(),
                "version": __version__,
                "error": (f"protocol mismatch: the client speaks protocol {theirs!r}, the server (pid "
                          f"{os.getpid()}, overmind {__version__}) speaks {PROTOCOL_VERSION}. Stop the old "
                          f"server with 'overmind stop' so a matching one starts, or upgrade overmind."),
            })
            return False
        self._reply({"ok": True, "protocol": PROTOCOL_VERSION, "server_pid": os.getpid(),
                     "version": __version__})
        return True

    def _serve_one(self) -> bool:
        """Answer one request; False when the connection should end (after ``stop``)."""
        msg, fds = recv_message(self.sock)
        op = msg.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        out_fds: list[int] = []
        try:
            if handler is None:
                close_fds(fds)
                raise BadRequest(f"unknown op {op!r}; this server (protocol {PROTOCOL_VERSION}) knows "
                                 f"{', '.join(_OPS)}")
            # A handler owns the received fds from here on, success or not: closing them here as well could
            # close a number another thread has meanwhile reused.
            reply, out_fds = handler(msg, fds)
        except StoreError as exc:
            reply = {"ok": False, "reason": exc.reason, "error": str(exc)}
        try:
            self._reply(reply, out_fds)
        finally:
            close_fds(out_fds)
        if op == "stop":
            self.server.request_stop(f"'stop' from pid {self.peer_pid}")
            return False
        return True

    def _reply(self, obj: dict[str, Any], fds: list[int] = ()) -> None:
        send_message(self.sock, obj, fds)

    def _alive(self) -> bool:
        """Whether the client is still connected (used while it waits on another's claim)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    # ---- ops: each takes (msg, received fds) and returns (reply, fds to send) -----------------------------
    def _op_hello(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        return {"ok": True, "protocol": PROTOCOL_VERSION, "server_pid": os.getpid(), "version": __version__}, []

    def _op_get(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        key = _key(msg)
        timeout = msg.get("timeout")
        if timeout is not None and not isinstance(timeout, (int, float)):
            raise BadRequest(f"'timeout' must be a number of seconds or null, got {timeout!r}")
        out = self.store.get(key, self.conn_id, claim=bool(msg.get("claim", True)), wait=bool(msg.get("wait", True)),
                             timeout=timeout, alive=self._alive)
        reply: dict[str, Any] = {"ok": True, "status": out.status}
        if out.status == "hit":
            reply["entry"] = out.entry
            reply["fd_entries"] = out.fd_entries
        return reply, out.fds

    def _op_publish(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        try:
            key = _key(msg)
            deps = msg.get("deps", [])
            meta = msg.get("meta") or {}
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                raise BadRequest(f"'deps' must be a list of entry ids, got {deps!r}")
            if not isinstance(meta, dict):
                raise BadRequest(f"'meta' must be a JSON object, got {type(meta).__name__}")
            if len(fds) != 1:
                raise BadRequest(f"publish carries exactly one fd (the sealed memfd), got {len(fds)}")
        except BaseException:
            close_fds(fds)
            raise
        entry_id = self.store.publish(key, self.conn_id, fds[0], deps, meta)
        return {"ok": True, "entry_id": entry_id}, []

    def _op_release(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        return {"ok": True, "released": self.store.release(_key(msg), self.conn_id)}, []

    def _op_fds(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        ids = msg.get("entry_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadRequest(f"'entry_ids' must be a list of entry ids, got {ids!r}")
        return {"ok": True, "fd_entries": ids}, self.store.fds(ids)

    def _op_status(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        stats = self.store.stats()
        return {
            "ok": True, "pid": os.getpid(), "uptime": time.monotonic() - self.server.started,
            "version": __version__, "protocol": PROTOCOL_VERSION, "entries": stats["entries"],
            "bytes": stats["bytes"], "max_bytes": stats["max_bytes"], "claims": stats["claims"],
            "waiting": stats["waiting"], "clients": self.server.clients, "runtime_dir": self.server.runtime_dir,
            "log": self.server.log_file, "torch_imported": "torch" in sys.modules,
        }, []

    def _op_ls(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        return {"ok": True, "entries": self.store.listing()}, []

    def _op_evict(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        if msg.get("all"):
            evicted, refused = self.store.evict(all=True)
        else:
            evicted, refused = self.store.evict(_key(msg))
        return {"ok": True, "evicted": evicted, "refused": refused}, []

    def _op_stop(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        close_fds(fds)
        return {"ok": True, "pid": os.getpid()}, []


_OPS = sorted(name[4:] for name in vars(Connection) if name.startswith("_op_"))


def _key(msg: dict) -> str:
    key = msg.get("key")
    if not isinstance(key, str) or not key:
        raise BadRequest(f"'key' must be a non-empty string, got {key!r}")
    return key
