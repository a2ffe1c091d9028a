"""The one frame codec of the server, the client and ``overmind run``: length-prefixed JSON with SCM_RIGHTS fds on a
frame's first byte (``frames``, ``fds_received``, ``parse_payload``; ``send_message`` and ``recv_message`` on
blocking sockets), ``PROTOCOL_VERSION``, file-entry ids. See docs/architecture.md, "Wire protocol".

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (an object). File
descriptors ride on the frame's first byte as SCM_RIGHTS ancillary data, at most ``MAX_FDS_PER_FRAME`` per
frame, so they arrive with the header or not at all. A message with more fds than that carries ``"more_fds": n``
(the number still to come) in its own object and is followed by frames ``{"more_fds": k}``, each carrying ``k``
further fds; ``more_fds`` is therefore a reserved key.

:func:`send_message` and :func:`recv_message` do it on a blocking socket; the server's non-blocking reader and
outbox (``server/wire.py``) build on :func:`frames`, :func:`fds_received` and :func:`parse_payload`.

>>> send_message(sock, {"op": "publish", "key": k}, fds=[memfd])
>>> reply, fds = recv_message(sock)
"""
from __future__ import annotations

import _socket  # not socket: the launcher of ``overmind run`` speaks this protocol, and socket costs it 3 ms
import os
import struct

from .._util import interrupts, json_accel  # (json_accel, not json: json imports re and enum, ~5 ms more)
from ..errors import OvermindError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable

# Raised whenever a client and a server could misread each other's messages or entries: the two then refuse
# each other at hello, with a message naming the fix ('overmind stop'). docs/architecture.md, "Wire protocol".
PROTOCOL_VERSION = 6
MAX_FDS_PER_FRAME = 250
# A frame is a control message, never bulk data (bulk data travels as memfds), so a large length means a
# confused or hostile peer: refuse it rather than allocate it.
MAX_FRAME_BYTES = 64 * 1024 * 1024

HEADER = struct.Struct(">I")  # a frame's length
_FD_SIZE = struct.calcsize("i")
ANCILLARY_BYTES = _socket.CMSG_SPACE(MAX_FDS_PER_FRAME * _FD_SIZE)  # room for one frame's fds
# Received fds are close-on-exec so a loader that spawns subprocesses does not leak them.
RECV_FLAGS = getattr(_socket, "MSG_CMSG_CLOEXEC", 0)


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


def frames(obj: dict[str, Any], fds: Iterable[int] = ()) -> list[tuple[bytes, list[int]]]:
    """``obj`` with ``fds`` as the frames that carry them: ``(bytes, the fds riding on its first byte)`` each, the
    fds batched by ``MAX_FDS_PER_FRAME``. Raises ``FrameError`` for a message over the frame limit."""
    fds = list(fds)
    first, rest = fds[:MAX_FDS_PER_FRAME], fds[MAX_FDS_PER_FRAME:]
    if rest:
        obj = dict(obj, more_fds=len(rest))
    out = [(_frame(obj), first)]
    while rest:
        batch, rest = rest[:MAX_FDS_PER_FRAME], rest[MAX_FDS_PER_FRAME:]
        out.append((_frame({"more_fds": len(batch)}), batch))
    return out


def fds_received(ancdata: list[tuple[int, int, bytes]], flags: int) -> list[int]:
    """The fds of one ``recvmsg``'s ancillary data (``ancdata``, ``flags``: what it returned). Raises
    ``FrameError``, the fds closed, where the kernel had to drop some (the control data was truncated)."""
    fds: list[int] = []
    for level, kind, cdata in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            count = len(cdata) // _FD_SIZE
            fds.extend(struct.unpack(f"{count}i", cdata[:count * _FD_SIZE]))
    if flags & _socket.MSG_CTRUNC:
        close_fds(fds)
        raise FrameError(
            "file descriptors were lost in transit (control data truncated); the receiving process may be at its "
            "open-file limit (ulimit -n)"
        )
    return fds


def parse_payload(payload: bytes) -> dict[str, Any]:
    """The JSON object a frame's payload holds; ``FrameError`` for anything else."""
    try:
        obj = json_accel.loads(payload.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError
        raise FrameError(f"peer sent a frame that is not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"peer sent a JSON {type(obj).__name__}, expected an object")
    return obj


def send_message(sock: _socket.socket, obj: dict[str, Any], fds: Iterable[int] = ()) -> None:
    """Send ``obj`` as one message on a blocking socket, with ``fds`` attached (any number; batched by 250).

    The fds stay open in the sender; the receiver gets its own duplicates.
    """
    for data, batch in frames(obj, fds):
        if batch:
            # The fds ride on the first byte only, so the receiver can read exactly that byte with recvmsg and
            # never pull in ancillary data belonging to a later frame.
            rights = struct.pack(f"{len(batch)}i", *batch)
            if sock.sendmsg([data[:1]], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)]) != 1:
                raise ConnectionClosed("the peer did not accept the first byte of a frame")
            data = data[1:]
        sock.sendall(data)


def recv_message(sock: _socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Receive one message from a blocking socket: ``(obj, fds)``. The caller owns the returned fds and must
    close them.

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


def is_open(fd: int) -> bool:
    """Whether ``fd`` names an open descriptor in this process."""
    try:
        os.fstat(fd)
        return True
    except OSError as exc:
        interrupts.raise_users(exc)
        return False


def _frame(obj: dict[str, Any]) -> bytes:
    payload = json_accel.dumps(obj, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return HEADER.pack(len(payload)) + payload


def _recv_frame(sock: _socket.socket) -> tuple[dict[str, Any], list[int]]:
    first, fds = _recv_first_byte(sock)
    try:
        header = first + _recv_exactly(sock, HEADER.size - 1)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise FrameError(f"peer announced a {length}-byte frame; the limit is {MAX_FRAME_BYTES}")
        obj = parse_payload(_recv_exactly(sock, length))
    except BaseException:
        close_fds(fds)
        raise
    return obj, fds


def _recv_first_byte(sock: _socket.socket) -> tuple[bytes, list[int]]:
    try:
        data, ancdata, flags, _addr = sock.recvmsg(1, ANCILLARY_BYTES, RECV_FLAGS)
    except ConnectionResetError:
        raise ConnectionClosed("the peer reset the connection") from None
    fds = fds_received(ancdata, flags)
    if not data:
        close_fds(fds)
        raise ConnectionClosed("the peer closed the connection")
    return data, fds


def _recv_exactly(sock: _socket.socket, n: int) -> bytes:
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
