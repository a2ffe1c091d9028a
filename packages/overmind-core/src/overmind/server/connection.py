"""One client connection of the server: hello, then one request at a time, answered without blocking; what it needs
of the server is a ``Protocol``, not an import of ``daemon``.

The server's event loop (``daemon.Server``) reads and writes the socket; a ``Connection`` turns each whole
request into a call on the ``Store`` and queues the reply. A ``get`` that finds another connection's claim
is parked (``waiting``) and answered later, when the key is published or released or its timeout passes,
so no thread is tied up by a waiting client. The handler never unpickles or interprets client data beyond
the JSON of the request.
"""
from __future__ import annotations

import os
import socket
import sys
import time

from .._version import __version__
from ..ipc import ops
from ..ipc.protocol import PROTOCOL_VERSION, close_fds
from . import blobs, imports
from .log import log
from .store import GetOutcome, StoreError
from .wire import FrameReader, Outbox

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from .limits import Limits
    from .store import Store
    from .uploads import Uploader
    from .wire import BufferBudget

    class Server(Protocol):
        """What a connection needs of the server that accepted it (``daemon.Server``)."""

        store: Store
        uploads: Uploader
        limits: Limits
        buffer_budget: BufferBudget
        started: float
        clients: int
        runtime_dir: str
        log_file: str
        last_lost: dict | None

        def request_stop(self, why: str) -> None: ...
        def client_count(self, delta: int) -> None: ...
        def start_waiting(self, conn: Connection) -> None: ...
        def stop_waiting(self, conn: Connection) -> None: ...
        def waiting_count(self) -> int: ...


class BadRequest(StoreError):
    """A request with missing or ill-typed fields."""

    def __init__(self, message: str) -> None:
        super().__init__("bad request", message)


class Waiting:
    """A ``get`` parked on another connection's claim; ``deadline`` is monotonic, None waits for as long as the
    claim is held."""

    __slots__ = ("msg", "key", "claim", "deadline")

    def __init__(self, msg: dict[str, Any], key: str, claim: bool, deadline: float | None) -> None:
        self.msg, self.key, self.claim, self.deadline = msg, key, claim, deadline


class Connection:
    """State of one accepted socket; the server calls ``take``/``retry``/``expire`` and sends ``outbox``."""

    def __init__(self, server: Server, sock: socket.socket, conn_id: int, peer_pid: int) -> None:
        self.server = server
        self.store = server.store
        self.sock = sock
        self.conn_id = conn_id
        self.peer_pid = peer_pid
        self.reader = FrameReader(sock, server.limits, server.buffer_budget)
        self.outbox = Outbox()
        self.greeted = False
        self.last_active = self.accepted = time.monotonic()
        self.pending: tuple[dict[str, Any], list[int]] | None = None  # a whole request not yet handled
        self.waiting: Waiting | None = None
        self.parked = False  # the reader waits for room in the shared buffer budget
        self.closing = False  # close once the outbox is sent (after 'stop' or a refused hello)

    def __repr__(self) -> str:
        return f"connection {self.conn_id} (pid {self.peer_pid})"

    # ---- what the event loop asks ----------------------------------------------------------------------
    @property
    def wants_read(self) -> bool:
        # One request at a time: a second one stays in the kernel's buffer until the first is answered.
        # A connection parked on a claim keeps reading, so that its client closing is noticed at once.
        return not self.closing and not self.parked and self.pending is None

    @property
    def busy(self) -> bool:
        """Whether the connection is in the middle of something (not idle)."""
        return (self.waiting is not None or self.pending is not None or bool(self.outbox)
                or self.reader.mid_frame or self.parked or self.store.holds_claims(self.conn_id))

    def take(self, request: tuple[dict[str, Any], list[int]]) -> None:
        """A whole request arrived; handle it now if the previous one is answered, else keep it."""
        self.last_active = time.monotonic()
        self.pending = request
        self.advance()

    def advance(self) -> None:
        """Handle the kept request if nothing is in the way (a parked get, an unsent reply)."""
        if self.pending is None or self.waiting is not None or self.outbox or self.closing:
            return
        msg, fds = self.pending
        self.pending = None
        if not self.greeted:
            close_fds(fds)
            self._hello(msg)
        else:
            self._serve(msg, fds)

    def retry(self) -> bool:
        """Ask again for the key this connection waits on; True when it got its answer."""
        assert self.waiting is not None
        out = self.store.get(self.waiting.key, self.conn_id, claim=self.waiting.claim)
        if out.status == "busy":
            return False
        self._answer_get(out)
        return True

    def expire(self) -> None:
        """The parked get's timeout passed: answer ``busy``; the claim stays with its holder."""
        self._answer_get(GetOutcome("busy"))

    def discard(self) -> None:
        """Free everything the connection holds (it is being closed)."""
        self.reader.discard()
        self.outbox.discard()
        if self.pending is not None:
            close_fds(self.pending[1])
            self.pending = None
        self.waiting = None

    # ---- hello and requests ----------------------------------------------------------------------------
    def _hello(self, msg: dict[str, Any]) -> None:
        if msg.get("op") != "hello":
            self._send(msg, ops.error("the first request on a connection must be 'hello'; use "
                                      "overmind.client", reason="bad request"))
            self.closing = True
            return
        try:
            ops.check(msg, ops.SERVER)
        except ops.RequestError as exc:
            self._send(msg, ops.error(str(exc), reason="bad request"))
            self.closing = True
            return
        theirs = msg["protocol"]
        if theirs != PROTOCOL_VERSION:
            log.warning("refused pid %d: it speaks protocol %r, this server speaks %d", self.peer_pid, theirs,
                        PROTOCOL_VERSION)
            self._send(msg, ops.error(
                f"protocol mismatch: the client speaks protocol {theirs!r}, the server (pid "
                f"{os.getpid()}, overmind {__version__}) speaks {PROTOCOL_VERSION}. Stop the old "
                f"server with 'overmind stop' so a matching one starts, or upgrade overmind.",
                reason="protocol", **self._op_hello(msg, [])[0]))
            self.closing = True
            return
        self.greeted = True
        self.server.client_count(+1)
        self._send(msg, ops.ok(self._op_hello(msg, [])[0]))

    def _serve(self, msg: dict[str, Any], fds: list[int]) -> None:
        try:
            op = ops.check(msg, ops.SERVER)
        except ops.RequestError as exc:
            close_fds(fds)
            self._send(msg, ops.error(str(exc), reason="bad request"))
            return
        if op.fds_in is None:
            close_fds(fds)
            fds = []
        try:
            # A handler owns the received fds from here on, success or not.
            answer = _HANDLERS[op.name](self, msg, fds)
        except StoreError as exc:
            self._send(msg, ops.error(str(exc), reason=exc.reason))
            return
        if answer is None:
            return  # a get parked on another's claim
        reply, out_fds = answer
        self._send(msg, ops.ok(reply), out_fds)
        if op.name == "stop":
            self.closing = True
            self.server.request_stop(f"'stop' from pid {self.peer_pid}")

    def _send(self, msg: dict[str, Any], reply: dict[str, Any], fds: list[int] | tuple[()] = ()) -> None:
        """Queue ``reply`` to ``msg`` (the outbox owns ``fds`` from here); it names the request it answers."""
        if "id" in msg:
            reply = dict(reply, id=msg["id"])
        self.outbox.put(reply, fds)

    def _answer_get(self, out: GetOutcome) -> None:
        assert self.waiting is not None
        msg, self.waiting = self.waiting.msg, None
        self.server.stop_waiting(self)
        reply, fds = self._get_reply(msg, out)
        self._send(msg, ops.ok(reply), fds)

    @staticmethod
    def _get_reply(msg: dict[str, Any], out: GetOutcome) -> tuple[dict[str, Any], list[int]]:
        reply: dict[str, Any] = {"status": out.status, "key": msg["key"]}
        if out.status == "hit":
            reply["entry"] = out.entry
            reply["fd_entries"] = out.fd_entries
        elif out.status == "refused":
            reply["refused"] = out.entry  # why, the sizes and the message (server/admission.py)
        elif out.status == "claimed" and out.entry:
            reply["room"] = out.entry["room"]
            if out.entry.get("first"):
                reply["first"] = True  # no load of the key left a mark yet: publish only on reuse (server/marks.py)
        return reply, out.fds

    def _own_key(self, msg: dict) -> str:
        """The request's key; a claim the server took for this connection's process at its start (the spawner's,
        ``handoff.py``) becomes this connection's when it first names the key."""
        key = _key(msg)
        self.store.adopt(key, self.conn_id, self.peer_pid)
        return key

    # ---- ops (ipc/ops.py): each takes (msg, received fds) and returns (the reply's fields, fds to
    # send), or None when parked; the fds of an op that takes none are closed before it runs
    def _op_hello(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        return {"protocol": PROTOCOL_VERSION, "server_pid": os.getpid(), "version": __version__}, []

    def _op_get(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]] | None:
        key = self._own_key(msg)
        timeout = msg.get("timeout")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)):
            raise BadRequest(f"'timeout' must be a number of seconds or null, got {timeout!r}")
        claim, wait = bool(msg.get("claim", True)), bool(msg.get("wait", True))
        out = self.store.get(key, self.conn_id, claim=claim, counted=not msg.get("quiet"))
        if out.status == "busy" and wait and (timeout is None or timeout > 0):
            deadline = None if timeout is None else time.monotonic() + timeout
            self.waiting = Waiting(msg, key, claim, deadline)
            self.server.start_waiting(self)
            return None
        return self._get_reply(msg, out)

    def _op_publish(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        try:
            key = self._own_key(msg)
            deps = msg.get("deps", [])
            meta = msg.get("meta") or {}
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                raise BadRequest(f"'deps' must be a list of entry ids, got {deps!r}")
            if not isinstance(meta, dict):
                raise BadRequest(f"'meta' must be a JSON object, got {type(meta).__name__}")
            files = msg.get("files", [])
            if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
                raise BadRequest(f"'files' must be a list of file descriptions, got {files!r}")
            if len(fds) != 1 + len(files):
                raise BadRequest(f"publish carries exactly one fd (the sealed memfd)"
                                 f"{f' and one per file described ({len(files)})' if files else ''}, got {len(fds)}")
            held = _held_blobs(meta)
        except BaseException:
            close_fds(fds)
            raise
        out = self.store.publish(key, self.conn_id, fds[0], deps, meta, held, files=list(zip(files, fds[1:])))
        reply, out_fds = self._get_reply(msg, out)
        assert out.entry is not None  # a publish is answered like a get hit
        return dict(reply, entry_id=out.entry["entry_id"]), out_fds

    def _op_adopt(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        # An entry a client imported from the fleet, with its parts (server/imports.py)
        try:
            key = self._own_key(msg)
            meta = msg.get("meta") or {}
            if not isinstance(meta, dict):
                raise BadRequest(f"'meta' must be a JSON object, got {type(meta).__name__}")
            if not fds:
                raise BadRequest("adopt carries the entry's sealed memfd, then one per part")
            try:
                parts = imports.parse_parts(msg.get("parts", []), len(fds) - 1)
            except imports.BadImport as exc:
                raise BadRequest(str(exc)) from None
        except BaseException:
            close_fds(fds)
            raise
        out = self.store.store_import(key, self.conn_id, fds[0], meta,
                                      [(*part, fd) for part, fd in zip(parts, fds[1:])])
        reply, out_fds = self._get_reply(msg, out)
        assert out.entry is not None  # an adopt is answered like a get hit
        return dict(reply, entry_id=out.entry["entry_id"]), out_fds

    def _op_blobs(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        # Which entries hold bytes that may equal a publisher's storages (overmind.entries.dedup compares them).
        try:
            keys = blobs.parse_keys(msg.get("keys"))
        except blobs.BadBlobs as exc:
            raise BadRequest(str(exc)) from None
        found, ids, out_fds = self.store.find_blobs(keys)
        return {"found": [list(f) for f in found], "fd_entries": ids}, out_fds

    def _op_admit(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        # Before a publisher pickles and writes: can an entry of this size be admitted? (server/admission.py)
        need = msg.get("nbytes")
        if not isinstance(need, int) or isinstance(need, bool) or need < 0:
            raise BadRequest(f"'nbytes' must be the entry's estimated size in bytes, got {need!r}")
        return self.store.admit(self._own_key(msg), need), []

    def _op_first_done(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        # A first load ran under this connection's claim: publish (reused meanwhile) or leave a mark (marks.py)
        need = msg.get("nbytes")
        if not isinstance(need, int) or isinstance(need, bool) or need < 0:
            raise BadRequest(f"'nbytes' must be the entry's estimated size in bytes, got {need!r}")
        loader, summary = (str(msg.get(k) or "")[:MAX_MARK_TEXT] for k in ("loader", "summary"))
        publish = self.store.first_done(self._own_key(msg), self.conn_id, need, loader, summary)
        return {"publish": publish}, []

    def _op_release(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        return {"released": self.store.release(self._own_key(msg), self.conn_id)}, []

    def _op_bad(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        entry_id = msg.get("entry_id")
        if not isinstance(entry_id, str):
            raise BadRequest(f"'entry_id' must be the id of the entry that failed, got {entry_id!r}")
        return {"marked": self.store.mark_bad(_key(msg), entry_id)}, []

    def _op_fds(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        ids = msg.get("entry_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadRequest(f"'entry_ids' must be a list of entry ids, got {ids!r}")
        return {"fd_entries": ids}, self.store.fds(ids)

    def _op_status(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        stats = self.store.stats()
        return {
            "pid": os.getpid(), "uptime": time.monotonic() - self.server.started,
            "version": __version__, "protocol": PROTOCOL_VERSION, "entries": stats["entries"],
            "bytes": stats["bytes"], "max_bytes": stats["max_bytes"], "claims": stats["claims"],
            "waiting": self.server.waiting_count(), "clients": self.server.clients,
            "runtime_dir": self.server.runtime_dir, "log": self.server.log_file,
            "torch_imported": "torch" in sys.modules, "fds": _open_fds(), "last_lost": self.server.last_lost,
            **{k: stats[k] for k in ("gets", "hits", "bytes_served", "publishes", "evictions", "blobs",
                                   "files", "file_bytes", "refused_keys", "marks", "marked_bytes",
                                   "fleet_imports") if k in stats},
            **self.server.uploads.counters, "fleet_uploads_pending": self.server.uploads.pending(),
        }, []

    def _op_ls(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        return {"entries": self.store.listing(), "files": self.store.file_listing(),
                "marks": self.store.marks.listing()}, []

    def _op_evict(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        if msg.get("all"):
            evicted, refused = self.store.evict(all=True)
        else:
            evicted, refused = self.store.evict(_key(msg))
        return {"evicted": evicted, "refused": refused}, []

    def _op_stop(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        return {"pid": os.getpid()}, []


MAX_MARK_TEXT = 400  # a mark's loader name and argument summary, for 'overmind ls', cut to this many characters
_HANDLERS = ops.handlers(Connection, ops.SERVER)


def _key(msg: dict) -> str:
    key = msg.get("key")
    if not isinstance(key, str) or not key:
        raise BadRequest(f"'key' must be a non-empty string, got {key!r}")
    return key


def _held_blobs(meta: dict) -> list[tuple[str, int]]:
    """The publish's blob list, taken out of its meta (the index keeps it, the entry's meta does not)."""
    try:
        return blobs.parse_held(meta.pop("blobs", None))
    except blobs.BadBlobs as exc:
        raise BadRequest(str(exc)) from None


def _open_fds() -> int:
    """How many fds the server holds (entries, clients, its own), for ``status`` and leak checks."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opens
    except OSError:
        return -1
