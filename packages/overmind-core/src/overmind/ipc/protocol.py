"""Wire framing shared by the client and the server (see docs/architecture.md, "Wire protocol").

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (an object). File
descriptors ride on the frame's first byte as SCM_RIGHTS ancillary data, at most ``MAX_FDS_PER_FRAME`` per
frame. A message with more fds than that carries ``"more_fds": n`` (the number still to come) in its own
object and is followed by frames ``{"more_fds": k}``, each carrying ``k`` further fds. ``send_message`` and
``recv_message`` hide the batching; ``more_fds`` is therefore a reserved key.

>>> send_message(sock, {"op": "publish", "key": k}, fds=[memfd])
>>> reply, fds = recv_message(sock)
"""
from __future__ import annotations

import array
import json
import os
import socket
import struct

from .._util import interrupts
from ..errors import OvermindError

TYPE_CHECKING = False  # typing is not imported at run time: the server imports this module at its start
if TYPE_CHECKING:
    from typing import Any, Iterable

# 2: publish replies like a get hit (the entry and its fds), so a miss costs one round trip. A client and a
# server of different versions refuse each other at hello with a message naming the fix ('overmind stop').
# 3: file entries (issue 12): a publish may carry read-only fds of checkpoint files (``files``) whose pages its
# storages reference, and a hit's fds then include those files' (ids starting with ``FILE_ENTRY_PREFIX``).
# 4: a skeleton may open with opcodes that fill the unpickler's memo from the call's container arguments
# (``pickling.Pickled.argument_memo``, in the entry's meta): a client of version 3 would fail to rebuild it.
PROTOCOL_VERSION = 4
MAX_FDS_PER_FRAME = 250
# A frame is a control message, never bulk data (bulk data travels as memfds), so a large length means a
# confused or hostile peer: refuse it rather than allocate it.
MAX_FRAME_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct(">I")
_FD_SIZE = array.array("i").itemsize
# Received fds are close-on-exec so a loader that spawns subprocesses does not leak them.
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)


# ---- file entries ----------------------------------------------------------------------------------------
# A file entry stands for one checkpoint file as it was when published: its id is derived from the file's
# identity, the same tuple ``keys/fingerprint.py`` keys a path by (ctime cannot be set by the user, so a rewrite
# with size and mtime put back still changes it). A reader maps such an fd as the whole file (no header).
FILE_ENTRY_PREFIX = "file-"
FILE_IDENTITY_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def file_identity(st: os.stat_result) -> dict[str, int]:
    """The identity of a file as a publish describes it and the server checks it (``os.fstat`` of its fd)."""
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def file_entry_id(identity: dict[str, int]) -> str:
    """``file-<dev>-<ino>-<size>-<mtime_ns>-<ctime_ns>`` (hexadecimal) of a file identity: one id per file
    version, the same in every process. The fields themselves, not a digest of them: two identities never share
    an id, and the server need not load a hash library (OpenSSL's) for it."""
    return FILE_ENTRY_PREFIX + "-".join(format(int(identity[f]), "x") for f in FILE_IDENTITY_FIELDS)


def is_file_entry(entry_id: str) -> bool:
    """Whether ``entry_id`` names a file entry (a checkpoint file) rather than a memfd entry."""
    return entry_id.startswith(FILE_ENTRY_PREFIX)


class ConnectionClosed(OvermindError, ConnectionError):
    """The peer closed the connection (or died) before a whole frame arrived."""


class FrameError(OvermindError, ValueError):
    """The peer sent bytes that are not a valid frame (bad length, bad JSON, lost fds)."""


def send_message(sock: socket.socket, obj: dict[str, Any], fds: Iterable[int] = ()) -> None:
    """Send ``obj`` as one message, with ``fds`` attached (any number; batched by 250).

    The fds stay open in the sender; the receiver gets its own duplicates.
    """
    fds = list(fds)
    first, rest = fds[:MAX_FDS_PER_FRAME], fds[MAX_FDS_PER_FRAME:]
    if rest:
        obj = dict(obj, more_fds=len(rest))
    _send_frame(sock, obj, first)
    while rest:
        batch, rest = rest[:MAX_FDS_PER_FRAME], rest[MAX_FDS_PER_FRAME:]
        _send_frame(sock, {"more_fds": len(batch)}, batch)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Receive one message: ``(obj, fds)``. The caller owns the returned fds and must close them.

    Raises ``ConnectionClosed`` if the peer disconnects, ``FrameError`` if it sends garbage (any fds that
    arrived with the bad message are closed first).
    """
    obj, fds = _recv_frame(sock)
    try:
        remaining = obj.pop("more_fds", 0)
        if not isinstance(remaining, int) or remaining < 0:
            raise FrameError(f"bad 'more_fds' value {remaining!r} in a message from the peer")
        while remaining > 0:
            extra, extra_fds = _recv_frame(sock)
            fds.extend(extra_fds)
            count = extra.get("more_fds")
            if set(extra) != {"more_fds"} or count != len(extra_fds) or count > remaining:
                raise FrameError(
                    f"expected a follow-up frame with {remaining} more fds, got {extra!r} with "
                    f"{len(extra_fds)} fds"
                )
            remaining -= count
    except BaseException:
        close_fds(fds)
        raise
    return obj, fds


def close_fds(fds: Iterable[int]) -> None:
    """Close every fd in ``fds``, ignoring ones already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            interrupts.raise_users(exc)


def _send_frame(sock: socket.socket, obj: dict[str, Any], fds: list[int]) -> None:
    payload = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        # The fds ride on the first byte only, so the receiver can read exactly that byte with recvmsg and
        # never pull in ancillary data belonging to a later frame.
        sent = socket.send_fds(sock, [data[:1]], fds)
        if sent != 1:
            raise ConnectionClosed("the peer did not accept the first byte of a frame")
        data = data[1:]
    sock.sendall(data)


def _recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    first, fds = _recv_first_byte(sock)
    try:
        header = first + _recv_exactly(sock, _HEADER.size - 1)
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise FrameError(f"peer announced a {length}-byte frame; the limit is {MAX_FRAME_BYTES}")
        payload = _recv_exactly(sock, length)
        try:
            obj = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FrameError(f"peer sent a frame that is not UTF-8 JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise FrameError(f"peer sent a JSON {type(obj).__name__}, expected an object")
    except BaseException:
        close_fds(fds)
        raise
    return obj, fds


def _recv_first_byte(sock: socket.socket) -> tuple[bytes, list[int]]:
    ancbufsize = socket.CMSG_SPACE(MAX_FDS_PER_FRAME * _FD_SIZE)
    try:
        data, ancdata, flags, _addr = sock.recvmsg(1, ancbufsize, _RECV_FLAGS)
    except ConnectionResetError:
        raise ConnectionClosed("the peer reset the connection") from None
    fds: list[int] = []
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(cdata) - len(cdata) % _FD_SIZE
            fds.extend(array.array("i", cdata[:usable]))
    if flags & socket.MSG_CTRUNC:
        close_fds(fds)
        raise FrameError(
            "file descriptors were lost in transit (control data truncated); the process may be at its "
            "open-file limit (ulimit -n)"
        )
    if not data:
        close_fds(fds)
        raise ConnectionClosed("the peer closed the connection")
    return data, fds


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except ConnectionResetError:
            k = 0
        if k == 0:
            raise ConnectionClosed(f"the peer closed the connection in the middle of a frame ({got}/{n} bytes)")
        got += k
    return bytes(buf)
