"""Keep Python's cyclic garbage collector out of a load, without taking it from the user.

A warm load allocates a large graph of new objects (a pipeline's modules, dicts, tensors). Every allocation
counts towards the collector's thresholds, so whichever load crosses them runs the collection, and a full
one walks the whole heap of the imported libraries: 0.25 s in a blog process, inside a 7 ms load (issue 12).
The objects a load builds are alive when it returns: a collection during it can free nothing of ours.

:func:`paused` therefore switches the collector off while Overmind works (keying, asking the server,
rebuilding, publishing; never while the user's loader runs: its garbage is the user's), and when the
outermost pause ends it

- collects the young generations once if an automatic collection came due meanwhile (``gc.collect(1)``:
  the objects made during the load, never the whole heap), so the counters do not fire a collection at the
  next allocation, i.e. at the start of the next load;
- restores the user's setting exactly: enabled again only if it was enabled when the outermost pause
  began; the thresholds are never touched.

The full collections the load's objects make due still run, at the next allocation the collector counts
outside a load: the user's cycles are collected as they would be without Overmind, only not inside it.

>>> with collector.paused():
...     obj = entry.decode(...)
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0  # pauses in progress, all threads together: the collector is one per process
_resume = False  # whether the outermost pause found the collector enabled


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside; nested and concurrent pauses end with the last one."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            resume = _depth == 0 and _resume
            if resume:
                _resume = False
        if resume:
            _collect_young_if_due()  # outside the lock: a finalizer it runs may load, and pause again
            with _lock:
                if _depth == 0:
                    gc.enable()
                else:
                    _resume = True  # a pause began meanwhile (found it off): that one enables it when it ends


def _collect_young_if_due() -> None:
    count0, count1, _ = gc.get_count()
    threshold0, threshold1, _ = gc.get_threshold()
    if threshold0 and (count0 > threshold0 or count1 > threshold1):
        gc.collect(1)


def depth() -> int:
    """How many pauses are in progress (0 outside any load)."""
    return _depth
