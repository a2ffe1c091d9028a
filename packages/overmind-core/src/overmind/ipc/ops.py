"""Every op of the wire, declared once, as data: its request and reply fields, the file descriptors
it carries, the protocol version that introduced it and the daemon that serves it.

Two daemons speak the frame codec of :mod:`.protocol`: the cache server (``server/connection.py``)
and the ``overmind run`` template (``runner/template.py``). Each dispatches a request through
:func:`check` to its ``_op_<name>`` method (:func:`handlers`); the clients build their requests with
:func:`request`; both daemons answer in one shape, :func:`ok` or :func:`error`. ``python
docs/hooks/generated.py`` writes the table of docs/architecture.md, "Wire protocol", from :data:`OPS`.

>>> request("release", key="ab12")
{'op': 'release', 'key': 'ab12'}
>>> check({"op": "release"}, SERVER)
Traceback (most recent call last):
RequestError: op 'release' lacks its field 'key': release(key); ...

A request is a JSON object with ``op`` and the op's fields, and may carry ``id``, which its reply
echoes. A reply is ``{"ok": true, <the reply fields>}`` or ``{"ok": false, "error": <a sentence that
says what to do>}``; the server's refusals add ``reason``, a word a client can test. A daemon ignores
fields it does not know (a newer client's optional ones) and refuses a request that lacks a field its
row needs. A template's peers are of its own installation (its key holds overmind's version and
folder), so it has no ``hello``; ``since`` of its ops is the protocol version of the code that
introduced them.

Imported by ``overmind run``'s launcher: the standard library and this package only, no ``typing``.
"""
from __future__ import annotations

from ..errors import OvermindError
from .protocol import PROTOCOL_VERSION

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

SERVER = "server"  # the cache server: server/connection.py
TEMPLATE = "template"  # an ``overmind run`` template: runner/template.py


class RequestError(OvermindError, ValueError):
    """A request its op's row refuses: an unknown op or a needed field missing (the daemon answers
    with :func:`error`), or, on the client side, a field the row does not declare."""


class Field:
    """One field of a request or a reply; an ``optional`` one may be left out (an optional reply
    field is in some replies only)."""

    __slots__ = ("name", "about", "optional")

    def __init__(self, name: str, about: str, optional: bool) -> None:
        self.name, self.about, self.optional = name, about, optional

    def __repr__(self) -> str:
        return f"{self.name}{'?' if self.optional else ''}"


def need(name: str, about: str = "") -> Field:
    """A field every request of the op carries (a reply field every ``ok`` reply carries)."""
    return Field(name, about, False)


def may(name: str, about: str = "") -> Field:
    """A field that may be left out."""
    return Field(name, about, True)


class Op:
    """One op; ``fds_in``/``fds_out`` say which descriptors its request/its reply carries (None:
    none, and a daemon closes any that come with such a request before its handler runs)."""

    __slots__ = ("name", "daemon", "since", "about", "request", "reply", "fds_in", "fds_out")

    def __init__(self, name: str, daemon: str, since: int, about: str, *,
                 request: tuple[Field, ...] = (), reply: tuple[Field, ...] = (),
                 fds_in: str | None = None, fds_out: str | None = None) -> None:
        self.name, self.daemon, self.since, self.about = name, daemon, since, about
        self.request, self.reply, self.fds_in, self.fds_out = request, reply, fds_in, fds_out

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.request))})"


_HIT_FDS = ("the entry's memfd, then one of every entry it depends on; an id `file-...` is the "
            "checkpoint file itself, read-only")
_ENTRY = "`{entry_id, key, nbytes, meta, deps}`"
_HIT = (need("status", "`hit`"), need("key"), need("entry", _ENTRY + " of the entry serving `key`"),
        need("fd_entries", "the entry ids of the fds sent, in order"))
_STATUS = ("pid", "uptime", "version", "protocol", "entries", "bytes", "max_bytes", "claims",
           "waiting", "clients", "runtime_dir", "log", "torch_imported", "fds", "last_lost", "gets",
           "hits", "bytes_served", "publishes", "evictions", "blobs", "files", "file_bytes",
           "refused_keys", "marks", "marked_bytes", "fleet_imports", "fleet_uploads",
           "fleet_upload_bytes", "fleet_upload_failures", "fleet_uploads_pending")

# One row an op: a new op is its row here, its ``_op_<name>`` method in the daemon that serves it,
# its call in that daemon's client and, for a server op, its exchange in tests/ipc/test_wire_ops.py.
OPS: dict[str, Op] = {op.name: op for op in (
    Op("hello", SERVER, 1,
       "the first request on a connection; a protocol mismatch is an error with `reason` "
       "`protocol` (and the server's `protocol`, `server_pid`, `version`), and the server closes",
       request=(need("protocol", "the client's `PROTOCOL_VERSION`"), may("pid"), may("version")),
       reply=(need("protocol"), need("server_pid"), need("version"))),
    Op("get", SERVER, 1,
       "look `key` up; a key another connection holds claimed is waited on, without a thread",
       request=(need("key"),
                may("claim", "bool, default true: a miss is claimed for this connection"),
                may("wait", "bool, default true: wait on another's claim"),
                may("timeout", "seconds or null: how long to wait"),
                may("quiet", "bool: a hit is not counted as a use, as when a template builds ahead")),
       reply=(need("status", "`hit`, or `claimed`: you load it, `miss`: claim=false, `busy`: "
                   "another loads it and wait=false or the wait timed out, `refused`: larger than "
                   "the whole budget, load it plainly"),
              need("key"),
              may("entry", "hit: " + _ENTRY),
              may("fd_entries", "hit: the entry ids of the fds sent, in order"),
              may("room", "claimed: the bytes an entry may take before its publisher asks `admit`"),
              may("first", "claimed: no load of the key left a mark; ask `first_done` first"),
              may("refused", "refused: why, the sizes and the `message`")),
       fds_out="hit: " + _HIT_FDS),
    Op("admit", SERVER, 5,
       "before a publisher pickles and writes: can an entry of `nbytes` be admitted",
       request=(need("key"), need("nbytes", "the entry's estimated size, before it is pickled")),
       reply=(need("admitted", "bool"),
              may("why", "`budget`: larger than the whole budget, remembered for `key`, or "
                  "`in use`: the room cannot be freed now"),
              may("need"), may("budget"), may("can_free"), may("message"))),
    Op("publish", SERVER, 1,
       "publish a sealed memfd as `key`, answered like a `get` hit (not counted in `hits`); "
       "reasons: `not sealed`, `dep missing`, `budget`, `file changed`",
       request=(need("key"), may("deps", "[entry_id]"), may("meta", "{json}"),
                may("files", "[{`entry_id`, `path`, `dev`, `ino`, `size`, `mtime_ns`, "
                    "`ctime_ns`}]")),
       reply=(*_HIT, need("entry_id")),
       fds_in="the sealed memfd, then one read-only fd per file of `files`", fds_out=_HIT_FDS),
    Op("adopt", SERVER, 6,
       "store an entry imported from the fleet's store as `key`, with the blobs it depends on as "
       "parts (`server/imports.py`), answered like a `get` hit; reasons: `not sealed`, `budget`, "
       "`file changed`",
       request=(need("key"), may("meta", "{json}: the entry's meta as its publisher wrote it"),
                need("parts", "[{`entry_id`: the publisher's id, `kind`: `entry` | `file`, "
                     "`digest`: sha256 hex, `file`?: a checkpoint file of this machine holding "
                     "those bytes, described as `publish`'s `files`}]")),
       reply=(*_HIT, need("entry_id")),
       fds_in="the entry's sealed memfd, then one fd per part: a sealed memfd, or the described "
              "file opened read-only", fds_out=_HIT_FDS),
    Op("first_done", SERVER, 5,
       "a first load ran under this connection's claim: publish it (another asked for `key` "
       "meanwhile; the claim stays), or not (`key` is marked and its claim released)",
       request=(need("key"), need("nbytes", "the result's storage bytes"),
                may("loader", "for `ls`"), may("summary", "for `ls`")),
       reply=(need("publish", "bool"),)),
    Op("release", SERVER, 1,
       "release this connection's claim on `key` (its load failed); a waiter gets `claimed`",
       request=(need("key"),), reply=(need("released", "bool"),)),
    Op("fds", SERVER, 1, "fresh fds of entries",
       request=(need("entry_ids"),), reply=(need("fd_entries"),),
       fds_out="one of each entry named, in order"),
    Op("blobs", SERVER, 2,
       "entries that may hold these bytes (at most 4 holders a key); the client byte-compares "
       "before it references them",
       request=(need("keys", "blob keys `<nbytes>:<hex>` of `overmind.entries.dedup`"),),
       reply=(need("found", "[[position in `keys`, entry_id, offset]]"),
              need("fd_entries", "the entry ids of the fds sent")),
       fds_out="one of each entry named in `found`"),
    Op("status", SERVER, 1, "the server's state and counters",
       reply=tuple(need(name) for name in _STATUS)),
    Op("ls", SERVER, 1, "every entry, checkpoint file and mark",
       reply=(need("entries", "[{`entry_id`, `key`, `nbytes`, `hits`, `created`, `last_used`, "
                   "`meta`, `deps`, `referenced_by`}]"),
              need("files", "[{`entry_id`, `path`, `nbytes`, `referenced_by`, `changed`, "
                   "identity}]"),
              need("marks", "[{`key`, `nbytes`, `loader`, `summary`, `first_load`, `last_load`, "
                   "`loads`}]"))),
    Op("evict", SERVER, 1, "evict `key`, or with `all` every entry and mark",
       request=(may("key"), may("all", "bool")),
       reply=(need("evicted", "[keys]"), need("refused", "[{`key`, `reason`}]"))),
    Op("bad", SERVER, 1,
       "entry `entry_id` does not rebuild: it no longer serves `key` (the next `get` claims) and "
       "is freed once no entry references it",
       request=(need("key"), need("entry_id")), reply=(need("marked", "bool"),)),
    Op("stop", SERVER, 1, "the server replies, removes its socket and exits",
       reply=(need("pid"),)),
    Op("info", TEMPLATE, 1, "the template's info, as its info file holds it",
       reply=(need("info"),)),
    Op("run", TEMPLATE, 1,
       "fork a child that becomes the caller's process and runs its program; an error with "
       "`stale`: a module the template imported changed on disk (start another template)",
       request=(need("program", "`kind` and `path`, `module` or `code`"),
                need("path0", "the program's sys.path[0] or null"), need("orig_argv"),
                need("env"), need("fds", "what each fd sent is: `stdin`, `fd:<n>`, `cwd`, ..."),
                need("umask"), need("rlimits"), may("affinity"), need("nice"),
                need("signals", "dispositions and mask")),
       reply=(may("started", "the program's pid, in the first reply"),
              may("exit", "its wait status, in a second reply once it ended"),
              may("stale", "bool, in an error reply")),
       fds_in="the caller's descriptors, as `fds` names them",
       fds_out="started: the program's pidfd"),
)}


def served_by(daemon: str) -> list[Op]:
    """The ops ``daemon`` (:data:`SERVER` or :data:`TEMPLATE`) serves, in table order."""
    return [op for op in OPS.values() if op.daemon == daemon]


def check(msg: dict[str, Any], daemon: str) -> Op:
    """The row of request ``msg`` for ``daemon``; :class:`RequestError` (answered with
    :func:`error`) for an op it does not serve or a needed field missing. The values are the
    handler's to check."""
    name = msg.get("op")
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None or op.daemon != daemon:
        known = ", ".join(sorted(o.name for o in served_by(daemon)))
        raise RequestError(
            f"unknown op {name!r}; this {daemon} (protocol {PROTOCOL_VERSION}) knows {known}")
    missing = [f.name for f in op.request if not f.optional and f.name not in msg]
    if missing:
        raise RequestError(
            f"op {op.name!r} lacks its field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(repr, missing))}: {op!r}; a client of another overmind version may be "
            f"talking to this {daemon}: run 'overmind stop' (see overmind/ipc/ops.py)")
    return op


def request(name: str, /, **fields: Any) -> dict[str, Any]:
    """The request of op ``name`` with ``fields``, checked against its row: :class:`RequestError`
    for an unknown op, a needed field left out or a field the row does not declare."""
    op = OPS.get(name)
    if op is None:
        raise RequestError(f"unknown op {name!r}; the ops are {', '.join(OPS)}")
    undeclared = sorted(set(fields) - {f.name for f in op.request})
    missing = [f.name for f in op.request if not f.optional and f.name not in fields]
    if undeclared or missing:
        raise RequestError(f"a request {name!r} takes {op!r}; got {sorted(fields)} (undeclared: "
                           f"{undeclared or 'none'}, missing: {missing or 'none'})")
    return {"op": name, **fields}


def ok(fields: dict[str, Any] | None = None, /, **more: Any) -> dict[str, Any]:
    """A reply that succeeded: ``{"ok": True, **fields, **more}``."""
    return {"ok": True, **(fields or {}), **more}


def error(message: str, /, **fields: Any) -> dict[str, Any]:
    """A refusal: ``{"ok": False, "error": message, **fields}`` (the server's add ``reason``)."""
    return {"ok": False, "error": message, **fields}


def handlers(cls: type, daemon: str) -> dict[str, Callable[..., Any]]:
    """``{op name: cls._op_<name>}`` for every op ``daemon`` serves; ``LookupError`` where a
    served op has no method or a method no row (a daemon fails as it is imported, not on its first
    such request)."""
    table = {op.name: getattr(cls, f"_op_{op.name}", None) for op in served_by(daemon)}
    lacking = sorted(name for name, fn in table.items() if fn is None)
    extra = sorted(n[4:] for n in dir(cls) if n.startswith("_op_") and n[4:] not in table)
    if lacking or extra:
        raise LookupError(f"{cls.__name__} and overmind/ipc/ops.py disagree: ops without a "
                          f"method: {lacking or 'none'}; methods without a row: {extra or 'none'}")
    return {name: fn for name, fn in table.items() if fn is not None}
