"""Keep Python's cyclic garbage collector out of a load, without taking it from the user.

A warm load allocates a large graph of new objects (a pipeline's modules, dicts, tensors). Every allocation counts
towards the collector's thresholds, so whichever load crosses them runs the collection, and a full one walks the
whole heap of the imported libraries, many times the load's own time (docs/architecture.md, "Measured costs"). The
objects a load builds are alive when it returns: a collection during it can free nothing of ours.

:func:`paused` therefore switches the collector off while Overmind works (keying, asking the server,
rebuilding, publishing; never while the user's loader runs: its garbage is the user's), and when the
outermost pause ends it

- collects the young generations once if an automatic collection came due meanwhile (``gc.collect(1)``:
  the objects made during the load, never the whole heap), so the counters do not fire a collection at the
  next allocation, i.e. at the start of the next load;
- restores the user's setting exactly: enabled again only if it was enabled when the outermost pause
  began; the thresholds are never touched. A child forked while another thread had the collector paused
  gets it back at once (that thread's pause does not exist in the child).

The full collections the load's objects make due still run, at the next allocation the collector counts
outside a load: the user's cycles are collected as they would be without Overmind, only not inside it.

>>> with gc_pause.paused():
...     obj = codec.decode(...)
"""
from __future__ import annotations

import contextlib
import gc
import os as _os
import threading
from typing import Iterator

_lock = threading.Lock()
_held: dict[int, int] = {}  # thread ident -> pauses it has in progress (the collector is one per process)
_resume = False  # whether the outermost pause found the collector enabled
_enabling = False  # the last pause ended and is about to enable the collector again


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside; nested and concurrent pauses end with the last one."""
    global _resume, _enabling
    me = threading.get_ident()
    with _lock:
        if not _held:
            _resume = gc.isenabled()
            gc.disable()
        _held[me] = _held.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            left = _held.pop(me) - 1
            if left:
                _held[me] = left
            resume = not _held and _resume
            if resume:
                _resume, _enabling = False, True
        if resume:
            try:
                _collect_young_if_due()  # outside the lock: a finalizer it runs may load, and pause again
            finally:
                with _lock:
                    _enabling = False
                    if not _held:
                        gc.enable()
                    else:
                        _resume = True  # a pause began meanwhile (found it off): that one enables it when it ends


def _after_fork_in_child() -> None:
    """Only the forking thread lives on in a child: the pauses of the others ended with them."""
    global _lock, _resume, _enabling
    _lock = threading.Lock()  # another thread may have held it at the fork
    mine = _held.get(threading.get_ident(), 0)
    _held.clear()
    if mine:
        _held[threading.get_ident()] = mine
    elif _resume or _enabling:
        _resume = _enabling = False
        gc.enable()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def _collect_young_if_due() -> None:
    count0, count1, _ = gc.get_count()
    threshold0, threshold1, _ = gc.get_threshold()
    if threshold0 and (count0 > threshold0 or count1 > threshold1):
        gc.collect(1)


def depth() -> int:
    """How many pauses are in progress, all threads together (0 outside any load)."""
    return sum(_held.values())
