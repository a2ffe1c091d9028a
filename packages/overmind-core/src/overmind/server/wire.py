"""The server's side of the frame codec (:mod:`overmind.ipc.protocol`), on non-blocking sockets: a frame reader
bounded by a buffer budget every connection shares, and an outbox sending what the socket takes.

``FrameReader`` reads one request frame at a time, as its bytes arrive: the announced length is checked
against the request limit and never allocated up front, and a frame larger than a small control message
must first get room from the ``BufferBudget`` every connection shares, so buffered bytes stay bounded
whatever peers announce. ``Outbox`` queues replies (fds on each frame's first byte, batched by 250) and
sends what the socket takes, so a peer that does not read its replies never blocks the server.
"""
from __future__ import annotations

import socket
import time

from ..ipc.protocol import (
    ANCILLARY_BYTES,
    HEADER,
    MAX_FDS_PER_FRAME,
    RECV_FLAGS,
    ConnectionClosed,
    FrameError,
    close_fds,
    fds_received,
    frames,
    parse_payload,
)
from .limits import Limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_CHUNK = 64 << 10


class BufferBudget:
    """Bytes of large frames being received, by all connections together, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n


class FrameReader:
    """Incremental reader of one connection's request frames."""

    PARKED = "parked"  # read() result: the frame waits for room in the shared budget

    def __init__(self, sock: socket.socket, limits: Limits, budget: BufferBudget) -> None:
        self.sock = sock
        self.limits = limits
        self.budget = budget
        self.started: float | None = None  # monotonic time of the current frame's first byte
        self._reset()

    def _reset(self) -> None:
        self._header = b""
        self._fds: list[int] = []
        self._length: int | None = None
        self._payload = bytearray()
        self._reserved = 0
        self.started = None

    @property
    def mid_frame(self) -> bool:
        return self.started is not None

    def read(self) -> tuple[dict[str, Any], list[int]] | str | None:
        """Read what has arrived: ``(request, fds)`` once a frame is whole, ``None`` if more must come,
        ``PARKED`` while the budget has no room. Raises ``ConnectionClosed`` or ``FrameError``; the fds of a
        frame that fails are closed."""
        try:
            return self._read()
        except BlockingIOError:
            return None
        except ConnectionResetError:
            self.discard()
            raise ConnectionClosed("the peer reset the connection") from None
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Drop the partial frame (the connection closes): its fds and its share of the budget."""
        close_fds(self._fds)
        self.budget.release(self._reserved)
        self._reset()

    def _read(self) -> tuple[dict[str, Any], list[int]] | str | None:
        if not self._header:
            # The first byte alone, with recvmsg: it carries the frame's fds, and reading no further keeps
            # the ancillary data of a later frame out of this one.
            data, ancdata, flags, _ = self.sock.recvmsg(1, ANCILLARY_BYTES, RECV_FLAGS)
            self._fds.extend(fds_received(ancdata, flags))
            if not data:
                raise ConnectionClosed("the peer closed the connection")
            self._header = data
            self.started = time.monotonic()
        while len(self._header) < HEADER.size:
            data = self.sock.recv(HEADER.size - len(self._header))
            if not data:
                raise ConnectionClosed("the peer closed the connection in the middle of a frame header")
            self._header += data
        if self._length is None:
            (length,) = HEADER.unpack(self._header)
            if length > self.limits.max_request_bytes:
                raise FrameError(f"peer announced a {length}-byte frame; requests are at most "
                                 f"{self.limits.max_request_bytes} bytes")
            self._length = length
        if self._length > self.limits.small_frame_bytes and not self._reserved:
            if not self.budget.reserve(self._length):
                return self.PARKED
            self._reserved = self._length
        while len(self._payload) < self._length:
            data = self.sock.recv(min(_CHUNK, self._length - len(self._payload)))
            if not data:
                raise ConnectionClosed(f"the peer closed the connection in the middle of a frame "
                                       f"({len(self._payload)}/{self._length} bytes)")
            self._payload += data
        payload, fds = bytes(self._payload), self._fds
        self._fds = []
        self.discard()  # releases the budget; the fds now belong to the caller
        try:
            obj = parse_payload(payload)
        except FrameError:
            close_fds(fds)
            raise
        if "more_fds" in obj:
            close_fds(fds)
            raise FrameError(f"a request carries at most {MAX_FDS_PER_FRAME} fds (got 'more_fds')")
        return obj, fds


class Outbox:
    """Replies waiting to be sent on one connection; owns the fds queued with them until they are sent."""

    def __init__(self) -> None:
        self._segments: list[list[Any]] = []  # [bytes, fds riding on its first byte]

    def __bool__(self) -> bool:
        return bool(self._segments)

    def put(self, obj: dict[str, Any], fds: list[int] | tuple[()] = ()) -> None:
        """Queue ``obj`` with ``fds`` (ownership passes to the outbox), framed as ``send_message`` frames it."""
        self._segments.extend([data, batch] for data, batch in frames(obj, fds))

    def flush(self, sock: socket.socket) -> bool:
        """Send as much as ``sock`` takes now; True when everything went. Raises ``ConnectionClosed``."""
        try:
            while self._segments:
                seg = self._segments[0]
                if seg[1]:
                    if socket.send_fds(sock, [seg[0][:1]], seg[1]) != 1:
                        return False
                    close_fds(seg[1])
                    seg[0], seg[1] = seg[0][1:], []
                while seg[0]:
                    sent = sock.send(seg[0])
                    seg[0] = seg[0][sent:]
                self._segments.pop(0)
            return True
        except BlockingIOError:
            return False
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ConnectionClosed(f"the peer went away before its reply was sent ({exc.strerror})") from None

    def discard(self) -> None:
        """Close the fds of replies that will never be sent."""
        for seg in self._segments:
            close_fds(seg[1])
        self._segments = []
