"""What a loader does beside returning its result, recorded while it runs on a miss: the bookkeeping that the
warnings (:mod:`.loader_warnings`) and the log records (:mod:`.loader_logs`) share.

A recording notes what happens in its own thread alone; loads nest (a pipeline's loader loads its components), so
each thread keeps a stack of its running recordings, and every one notes what it sees. Hooks into the library
being watched (``warnings._showwarnmsg``, ``logging.Logger.handle``) go in when the first recording of the
process starts, in any thread, and come out when the last one ends, so nothing of Overmind's stays in
``warnings`` or ``logging`` between loads.

Something seen in a thread that records nothing may belong to a loader all the same (a helper thread it started,
a component it loads in a pool); its recording, which notes its own thread alone, would miss it, so every
recording of another thread is then unsure (:meth:`Running.doubt_other_threads`): when in doubt, not cached.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Generic, Iterator, TypeVar

R = TypeVar("R", bound="Recording")


class Recording:
    """One loader run's recording: :attr:`unsure` says why its result must not be cached (the first reason)."""

    def __init__(self) -> None:
        self.unsure: str | None = None
        self.thread = threading.get_ident()

    def doubt(self, why: str) -> None:
        if self.unsure is None:
            self.unsure = why


class Running(Generic[R]):
    """The recordings running in this process: each thread's stack (:meth:`mine`) and every thread's. ``start``
    puts the hooks in as the first one starts; ``stop`` takes them out after the last one ends."""

    def __init__(self, start: Callable[[], None], stop: Callable[[], None]) -> None:
        self._start, self._stop = start, stop
        self._local = threading.local()
        self._lock = threading.RLock()  # held while recordings start and end (and ``started`` runs)
        self._active: list[R] = []

    def mine(self) -> list[R]:
        """This thread's running recordings, the innermost last (empty: this thread records nothing)."""
        return getattr(self._local, "stack", None) or []

    def any(self) -> bool:
        return bool(self._active)

    @contextlib.contextmanager
    def running(self, rec: R, started: Callable[[], None] | None = None) -> Iterator[R]:
        """Run ``rec`` for the block, in this thread; ``started`` runs under the lock once the hooks are in."""
        with self._lock:
            if not self._active:
                self._start()
            if started is not None:
                started()
            self._active.append(rec)
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(rec)
        try:
            yield rec
        finally:
            stack.pop()
            with self._lock:
                self._active.remove(rec)
                if not self._active:
                    self._stop()

    def doubt_other_threads(self, why: str) -> None:
        """Something was seen in this thread: every recording of another thread might have missed its own."""
        me = threading.get_ident()
        for rec in list(self._active):
            if rec.thread != me:
                rec.doubt(why)
