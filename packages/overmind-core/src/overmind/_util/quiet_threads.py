"""Threads Overmind starts in a user's process (reapers, the server's start, the pickler) block the asynchronous
signals, so a signal sent to the process reaches its main thread and interrupts a blocking call there, as in plain
Python.

The kernel hands a signal sent to a process to any thread that does not block it. CPython runs the handler in
the main thread, but only once that thread returns to the interpreter: a signal taken by another thread leaves a
main thread blocked in a system call (``time.sleep``, a socket read, ``overmind run`` waiting for its program)
uninterrupted, and the handler waits with it. Plain Python has no such thread, so every helper thread Overmind
starts (reapers, the server start, the deep-stack pickler) blocks the asynchronous signals from its first
instruction; a fault raised by the thread's own code (SIGSEGV, SIGBUS, ...) is still delivered to it.
"""
from __future__ import annotations

import signal
import threading

SYNCHRONOUS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT,
                         signal.SIGTRAP, signal.SIGSYS})
BLOCKED = frozenset(signal.valid_signals()) - SYNCHRONOUS - {signal.SIGKILL, signal.SIGSTOP}


def start(thread: threading.Thread) -> threading.Thread:
    """Start ``thread`` with the asynchronous signals blocked in it (a new thread inherits the mask of the
    thread that starts it; the caller's own mask is back as it was on return). Returns ``thread``."""
    with blocked():
        thread.start()
    return thread


class blocked:  # noqa: N801 (used as a function: ``with blocked():``)
    """The asynchronous signals blocked in the calling thread for the ``with`` block: every thread started
    inside it, by Python or by a native library (OpenBLAS's workers), takes none of them. (A class, not a
    ``contextlib`` generator: the lean launcher imports this module, and neither ``contextlib`` nor ``typing``.)"""

    def __enter__(self) -> None:
        self.before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)

    def __exit__(self, *exc: object) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self.before)
