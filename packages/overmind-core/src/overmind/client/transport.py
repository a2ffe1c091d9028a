"""Socket I/O of the client with a deadline, and with the kernel's errors told apart from everyone else's.

``TimedSocket(sock, seconds)`` stands in for the socket in ``protocol.send_message``/``recv_message``: the
socket is non-blocking and every wait for it goes through ``poll`` with what is left of the deadline, so a
stopped server costs at most ``seconds`` (``ReplyTimeout``), never a hang.

Errors: an ``OSError`` the kernel gave (it has an errno) becomes ``TransportError``: the connection is
broken. Anything else raised while waiting, such as a ``TimeoutError`` or ``KeyboardInterrupt`` from the
user's signal handler, passes through untouched, so the client can drop the connection and re-raise it.
"""
from __future__ import annotations

import select
import socket
import time

from .._util import interrupts
from ..errors import OvermindError


class ReplyTimeout(OvermindError):
    """The server did not answer within the deadline (stopped, wedged or overloaded)."""


class TransportError(OvermindError, ConnectionError):
    """The kernel reported the connection broken (reset, EPIPE, ...)."""


class TimedSocket:
    """The four socket calls ``protocol`` makes, each bounded by one shared deadline."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._deadline = time.monotonic() + seconds
        self.seconds = seconds

    def fileno(self) -> int:
        return self._sock.fileno()

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0):
        return self._call(select.POLLIN, self._sock.recvmsg, bufsize, ancbufsize, flags)

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        return self._call(select.POLLIN, self._sock.recv_into, buffer, nbytes, flags)

    def sendmsg(self, buffers, ancdata=(), flags: int = 0, address=None) -> int:
        if address is None:
            return self._call(select.POLLOUT, self._sock.sendmsg, buffers, ancdata, flags)
        return self._call(select.POLLOUT, self._sock.sendmsg, buffers, ancdata, flags, address)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self._call(select.POLLOUT, self._sock.send, view)
            view = view[sent:]

    def _call(self, events: int, fn, *args):
        while True:
            try:
                return fn(*args)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                interrupts.raise_users(exc)
                if exc.errno is None:
                    raise  # not the kernel's: raised by a signal handler while we were in the call
                raise TransportError(exc.errno, exc.strerror) from None
            self._wait(events)  # outside the except clause: an exception from a handler carries no context

    def _wait(self, events: int) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise ReplyTimeout(f"no answer within {self.seconds:g} s")
        poller = select.poll()
        poller.register(self._sock.fileno(), events | select.POLLERR | select.POLLHUP)
        if not poller.poll(max(1, int(remaining * 1000 + 0.999))):
            raise ReplyTimeout(f"no answer within {self.seconds:g} s")
