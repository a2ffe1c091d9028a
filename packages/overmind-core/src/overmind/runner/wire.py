"""Messages between ``overmind run`` and a template: one JSON object per frame, with file descriptors.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON; the descriptors of a frame ride
on its first ``sendmsg`` (SCM_RIGHTS), so they arrive with the header or not at all. Both ends are the same
user's processes (checked with SO_PEERCRED before a byte is sent), so the JSON is trusted as far as a
user's own shell is; it is never unpickled.

>>> send(sock, {"op": "run", "argv": [...]}, fds=[0, 1, 2])
>>> message, fds = receive(sock)
"""
from __future__ import annotations

import array
import json
import os
import socket
import struct

from ..errors import OvermindError
from ..ipc.protocol import close_fds

MAX_FRAME = 64 << 20  # an environment and argv fit many times over
MAX_FDS = 250  # the kernel's SCM_MAX_FD is 253 per message
_LEN = struct.Struct(">I")


class Closed(OvermindError, ConnectionError):
    """The other end closed the connection (before or inside a frame)."""


def send(sock: socket.socket, message: dict, fds: list[int] | tuple[()] = ()) -> None:
    """Send ``message`` (JSON-serialisable) and, with it, duplicates of ``fds`` in the receiver."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _LEN.pack(len(body)) + body
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    sent = sock.sendmsg([data], ancillary)
    view = memoryview(data)[sent:]
    while view:
        view = view[sock.send(view):]


def receive(sock: socket.socket) -> tuple[dict, list[int]]:
    """The next frame's message and the descriptors that came with it (open in this process, CLOEXEC)."""
    fds: list[int] = []
    head = _read(sock, _LEN.size, fds)
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        _close_all(fds)
        raise ValueError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    body = _read(sock, size, fds)
    try:
        message = json.loads(body)
    except ValueError:
        _close_all(fds)
        raise
    if not isinstance(message, dict):
        _close_all(fds)
        raise ValueError("a frame must hold a JSON object")
    return message, fds


def _read(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        data, ancdata, _flags, _addr = sock.recvmsg(n - len(chunks), socket.CMSG_SPACE(MAX_FDS * 4),
                                                    socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds.extend(got)
        if not data:
            _close_all(fds)
            raise Closed("the other end closed the connection")
        chunks += data
    return bytes(chunks)


def _close_all(fds: list[int]) -> None:
    close_fds(fds)
    fds.clear()


def is_open(fd: int) -> bool:
    """Whether ``fd`` names an open descriptor in this process."""
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
