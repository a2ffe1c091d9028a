"""Run a deeply recursive C call (the pickler) where it cannot overflow the C stack: in the calling thread where its
stack fits the recursion limit, else on a helper thread sized for it.

The C pickler recurses once per nesting level of the object graph and stops at the recursion limit with a
``RecursionError``, which Overmind turns into a fallback. But a user who raised the limit
(``sys.setrecursionlimit(100_000)``) lets the pickler recurse past what the thread's C stack holds, and the
process dies with SIGSEGV; a thread started with a small ``threading.stack_size`` crashes even at the default
limit. So :func:`call` runs the function on a helper thread whose stack is sized for the current limit, and
where that would be too large, lowers the limit (never raises it) until the helper is done, then puts the
user's limit back.

Where the calling thread's own stack already has that room (``zerocopy.stack_room``: the main thread's 8 MiB
holds the default limit's 1,000 levels with the reserve to spare), the function runs right there, as plain
pickling would: no thread to start, and no malloc arena of a helper thread left holding the pickler's freed
memory (glibc keeps a thread arena's free top; 2-9 MiB in the cold fp32 blog process, docs/benchmarks.md).

Measured on CPython 3.11 (Overmind's pickler with its Python ``persistent_id`` and ``reducer_override``):
60-190 bytes of C stack per recursion level across instance, ``__reduce__``, list, dict and dill graphs;
:data:`BYTES_PER_LEVEL` allows 1 KiB. Only the pages the pickler touches are ever committed.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from .._util import quiet_threads

BYTES_PER_LEVEL = 1024
RESERVE = 4 << 20  # for the frames below the first recursion (hooks, reducers, torch's reduce)
MIN_STACK = 16 << 20
MAX_STACK = 256 << 20
FALLBACK_LIMIT = 1000  # where no helper thread can start: Python's default limit, in the caller's thread

_start_lock = threading.Lock()  # threading.stack_size is process-wide: one helper start at a time
_cap_lock = threading.Lock()
_cap: dict[str, Any] = {"users": 0, "user_limit": None, "capped": None}


def stack_for(limit: int) -> tuple[int, int]:
    """(stack bytes, recursion levels that stack holds) for a recursion limit of ``limit``."""
    stack = min(max(limit * BYTES_PER_LEVEL + RESERVE, MIN_STACK), MAX_STACK)
    return stack, (stack - RESERVE) // BYTES_PER_LEVEL


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with room for ``sys.getrecursionlimit()`` levels of C recursion: in this thread when its stack
    has that room, else on a helper thread.

    Exceptions from ``fn`` are raised here. A helper sees no thread-local state of the caller.
    """
    if _room_here():
        return fn(*args)
    stack, levels = stack_for(sys.getrecursionlimit())
    _lower_limit(levels)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            box["error"] = e
        finally:
            _restore_limit()  # here, not in the caller: an interrupted caller must not lift the cap early

    worker = threading.Thread(target=run, name="overmind-pickler", daemon=True)
    try:
        with _start_lock:
            previous = threading.stack_size(stack)
            try:
                quiet_threads.start(worker)
            finally:
                threading.stack_size(previous)
    except (RuntimeError, ValueError, MemoryError):  # no thread, or no stack of that size: stay here, cautiously
        _restore_limit()
        return _call_here(fn, *args)
    worker.join()
    if "error" in box:
        raise box.pop("error")
    return box["value"]


def _room_here() -> bool:
    """Whether this thread's stack holds the current limit's levels plus the reserve, with no cap in force (a cap
    another thread lifts meanwhile would raise the limit past what was checked)."""
    from ..native import zerocopy

    room = zerocopy.stack_room()
    with _cap_lock:
        return room is not None and _cap["users"] == 0 and room >= sys.getrecursionlimit() * BYTES_PER_LEVEL + RESERVE


def _call_here(fn: Callable[..., Any], *args: Any) -> Any:
    _lower_limit(FALLBACK_LIMIT)
    try:
        return fn(*args)
    finally:
        _restore_limit()


def _lower_limit(levels: int) -> None:
    """Cap the recursion limit at ``levels`` until the matching :func:`_restore_limit` (nests across threads)."""
    with _cap_lock:
        current = sys.getrecursionlimit()
        if _cap["users"] == 0:
            _cap["user_limit"] = current
            _cap["capped"] = None
        if current > levels:
            try:
                sys.setrecursionlimit(levels)
            except RecursionError as e:  # this thread is already deeper than the cap
                if _cap["users"] == 0:
                    _cap["user_limit"] = None
                raise RecursionError(f"the caller is {levels}+ frames deep; too deep to pickle safely") from e
            _cap["capped"] = levels
        _cap["users"] += 1


def _restore_limit() -> None:
    with _cap_lock:
        _cap["users"] -= 1
        if _cap["users"] == 0:
            # Put the user's limit back unless someone set another one meanwhile.
            if _cap["capped"] is not None and sys.getrecursionlimit() == _cap["capped"]:
                sys.setrecursionlimit(_cap["user_limit"])
            _cap["user_limit"] = _cap["capped"] = None
