"""Threads Overmind starts in a user's process take no asynchronous signal.

The kernel hands a signal sent to a process to any thread that does not block it. CPython runs the handler in
the main thread, but only once that thread returns to the interpreter: a signal taken by another thread leaves a
main thread blocked in a system call (``time.sleep``, a socket read, ``overmind run`` waiting for its program)
uninterrupted, and the handler waits with it. Plain Python has no such thread, so every helper thread Overmind
starts (reapers, the server start, the deep-stack pickler) blocks the asynchronous signals from its first
instruction; a fault raised by the thread's own code (SIGSEGV, SIGBUS, ...) is still delivered to it.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

SYNCHRONOUS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT,
                         signal.SIGTRAP, signal.SIGSYS})
BLOCKED = frozenset(signal.valid_signals()) - SYNCHRONOUS - {signal.SIGKILL, signal.SIGSTOP}


def start(thread: threading.Thread) -> threading.Thread:
    """Start ``thread`` with the asynchronous signals blocked in it (a new thread inherits the mask of the
    thread that starts it; the caller's own mask is back as it was on return). Returns ``thread``."""
    with blocked():
        thread.start()
    return thread


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """The asynchronous signals blocked in the calling thread for the block: every thread started inside it,
    by Python or by a native library (OpenBLAS's workers), takes none of them."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
