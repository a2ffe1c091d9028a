"""What the warnings (:mod:`.loader_warnings`) and the log records (:mod:`.loader_logs`) of a miss's loader share
while it runs: a recording's first doubt, each thread's stack of running recordings, the hooks the first recording
of the process puts in and the last takes out, and the doubt cast on other threads' recordings when a thread that
records nothing warns or logs. A signal handler's exception (Ctrl-C) can cut any step short, and every step stands
it.

A recording notes what happens in its own thread alone; loads nest (a pipeline's loader loads its components), so
each thread keeps a stack of its running recordings, and every one notes what it sees. Hooks into the library
being watched (``warnings._showwarnmsg``, ``logging.Logger.handle``) go in when the first recording of the
process starts, in any thread, and come out when the last one ends, so nothing of Overmind's stays in
``warnings`` or ``logging`` between loads.

Something seen in a thread that records nothing may belong to a loader all the same (a helper thread it started,
a component it loads in a pool); its recording, which notes its own thread alone, would miss it, so every
recording of another thread is then unsure (:meth:`Running.doubt_other_threads`): when in doubt, not cached.

A signal handler's exception (Ctrl-C's ``KeyboardInterrupt``, a deadline's) arrives in the main thread wherever
the interpreter runs handlers: as a function starts, at a loop's head, after any call returns; so also halfway
through the hooks going in or out. A recording enters its stack first, before any hook goes in, and leaves it
last, after the hooks are out, each in one call (``list.append``, ``list.remove``); while it is in, its thread
records, and recording shows the user what plain shows. ``start`` and ``stop`` are each safe to run again over
what an interrupted run of either left (``start`` never saves a hook of its own as the library's). So an
interrupt anywhere leaves either nothing or a recording that never leaves its stack (its end was cut short, even
before its first line): its thread goes on recording, as plain to the user, until the thread's next recording
starts, which drops every recording whose ``with`` no longer runs (:meth:`Running._drop_ended`), and whose end
makes whole what the hooks were left as.
"""
from __future__ import annotations

import sys
import threading
from types import FrameType, TracebackType
from typing import Callable, Generic, TypeVar

from ..._util import gc_pause

R = TypeVar("R", bound="Recording")


class Recording:
    """One loader run's recording: :attr:`unsure` says why its result must not be cached (the first reason).
    :meth:`begin` runs as it starts, the hooks in; :meth:`finish` as the block it records returns."""

    def __init__(self) -> None:
        self.unsure: str | None = None
        self._stack: list = []  # the stack of its thread it is in, while it runs
        self._owner: FrameType | None = None  # the frame whose ``with`` runs it

    def doubt(self, why: str) -> None:
        if self.unsure is None:
            self.unsure = why

    def begin(self) -> None:
        pass

    def finish(self) -> None:
        pass


class Running(Generic[R]):
    """The recordings running in this process: each thread's stack (:meth:`mine`), the innermost last. ``start``
    puts the hooks in as the first one starts; ``stop`` takes them out as the last one ends."""

    def __init__(self, start: Callable[[], None], stop: Callable[[], None]) -> None:
        self._start, self._stop = start, stop
        self._lock = threading.RLock()  # held while recordings start and end (and ``begin`` runs)
        self._stacks: dict[int, list[R]] = {}  # {thread ident: its running recordings}
        self._hooked = False  # ``start`` has run to its end, and ``stop`` has not begun since

    def mine(self) -> list[R]:
        """This thread's running recordings, the innermost last (empty: this thread records nothing)."""
        return self._stacks.get(threading.get_ident()) or []

    def any(self) -> bool:
        return any(self._stacks.values())

    def running(self, rec: R) -> Recorder[R]:
        """``with running(rec):`` records ``rec`` for the block, in this thread."""
        return Recorder(self, rec)

    def _enter(self, rec: R, owner: FrameType | None) -> None:
        rec._owner = owner
        with self._lock:
            stack = self._stacks.setdefault(threading.get_ident(), [])
            rec._stack = stack
            self._drop_ended(stack)
            stack.append(rec)  # first: from here on, a failure goes through _exit
            if not self._hooked:
                self._start()
                self._hooked = True
            rec.begin()

    def _exit(self, rec: R) -> None:
        """``rec`` ends: the hooks come out if no other recording runs; then, last, it leaves its stack. Until it
        has, its thread records as before, which shows the user what plain shows; cut short anywhere, what is
        left is that, or nothing."""
        with self._lock:
            if not any(r is not rec for stack in self._stacks.values() for r in stack):
                self._hooked = False
                self._stop()
            if rec in rec._stack:  # by identity: a recording is equal to no other
                rec._stack.remove(rec)
            rec._owner = None  # a frame whose locals hold the recording: no cycle outlives the block
            for thread in [t for t, s in self._stacks.items() if not s]:
                del self._stacks[thread]

    @staticmethod
    def _drop_ended(stack: list[R]) -> None:
        """Drop from this thread's ``stack`` the recordings whose ``with`` no longer runs (an interrupt cut their
        end short): a running one's frame is in this thread's chain of callers."""
        if not stack:
            return
        live = set()
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            live.add(id(frame))
            frame = frame.f_back
        for rec in [r for r in stack if id(r._owner) not in live]:
            stack.remove(rec)
            rec._owner = None

    def doubt_other_threads(self, why: str) -> None:
        """Something was seen in this thread: every recording of another thread might have missed its own."""
        me = threading.get_ident()
        for thread, stack in list(self._stacks.items()):
            if thread != me:
                for rec in list(stack):
                    rec.doubt(why)


class Recorder(Generic[R]):
    """The context manager of :meth:`Running.running` (a class: a generator's adds windows, see above)."""

    __slots__ = ("_running", "_rec")

    def __init__(self, running: Running[R], rec: R) -> None:
        self._running, self._rec = running, rec

    # Starting and ending a recording copies what it compares (a process's loggers, warning registries): thousands
    # of objects, made with the collector paused (gc_pause.py), so no full collection of the heap comes due there.
    def __enter__(self) -> R:
        with gc_pause.paused():
            try:
                self._running._enter(self._rec, sys._getframe(1))
            except BaseException:
                self._running._exit(self._rec)
                raise
        return self._rec

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with gc_pause.paused():
            try:
                if typ is None:
                    self._rec.finish()
            finally:
                self._running._exit(self._rec)
