"""Set the heap that exists when a load begins aside from the collector's walks while the load runs.

A full collection walks every object of the process: in a process that imported torch and a Hugging
Face library, hundreds of thousands of them, longer than a small model's whole load. Which load
makes one due is decided by allocation counters that a cached load moves differently from the plain
call (the key, the recordings, the pickle), so a load that plain finishes without one may run one.
:func:`set_aside` freezes the objects that exist when the outermost load of the process begins
(``gc.freeze()``) and gives them back (``gc.unfreeze()``) when it ends: collections inside the load,
the loader's own included, walk only what the load made, so the loader's garbage is collected as the
plain call's is, and an older object that becomes garbage during the load is collected by the first
full collection after it.

Left alone, since their frozen objects are their own business: a process whose heap is frozen at its
first load (the user's ``gc.freeze()``, an ``overmind run`` child), and a forked child (a pre-fork
server freezes its heap just before it forks). Telling whether a heap is frozen walks it
(``gc.get_freeze_count()``), so it is asked once, at the process's first load: a program that
freezes its heap after that, without forking, has it given back when its next load ends. Inside a
load, ``gc.get_objects()`` and ``gc.get_referrers()`` do not list the set-aside objects, as for any
frozen heap.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0  # loads in progress that asked, all threads together
_froze = False  # whether the outermost of them froze the heap (and so unfreezes it)
_allowed: bool | None = None  # whether this process sets its heap aside (None: its first load asks)


@contextlib.contextmanager
def set_aside() -> Iterator[None]:
    """Inside: the objects that existed when the outermost ``set_aside`` began are out of the
    walks."""
    global _depth, _froze, _allowed
    with _lock:
        if _depth == 0:
            if _allowed is None:
                _allowed = gc.get_freeze_count() == 0
            _froze = _allowed and gc.isenabled()
            if _froze:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            if _depth:
                _depth -= 1
                if _depth == 0 and _froze:
                    _froze = False
                    gc.unfreeze()


def leave_alone() -> None:
    """This process froze its heap itself (an ``overmind run`` child): its loads leave it frozen, and
    its first load does not walk it to find that out."""
    global _allowed
    with _lock:
        _allowed = False


def _after_fork_in_child() -> None:
    """The child's heap is its own again, and its loads leave it alone."""
    global _lock, _depth, _froze, _allowed
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _froze:
        gc.unfreeze()
    _depth, _froze, _allowed = 0, False, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
