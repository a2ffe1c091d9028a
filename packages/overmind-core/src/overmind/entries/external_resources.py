"""Objects that stand for something outside the process (open files, sockets, threads, locks, subprocesses): a
result holding one is not cached, and the refusal names where it holds it.

Their pickled form cannot be what the plain call returned, and dill's can act on the world: a file opened
for writing is reopened with its mode on unpickling, which truncates it on disk. A result holding one is
not cached; :func:`refusal` names the type and, where :func:`find_path` finds it, where the result holds it
(``result.logger.stream``).
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Any

MAX_PATH_SEARCH = 200_000  # objects visited looking for where the result holds the offending one

# (module, attribute) of each refused type; a module not imported yet has no instances to refuse.
_REFUSED = (
    ("io", "IOBase"), ("_io", "_IOBase"), ("tempfile", "_TemporaryFileWrapper"), ("tempfile", "SpooledTemporaryFile"),
    ("socket", "socket"), ("select", "epoll"), ("select", "poll"), ("select", "devpoll"), ("select", "kqueue"),
    ("selectors", "BaseSelector"), ("mmap", "mmap"), ("subprocess", "Popen"),
    ("_thread", "LockType"), ("_thread", "RLock"), ("_thread", "_local"), ("threading", "_RLock"),
    ("threading", "Thread"), ("threading", "Condition"), ("threading", "Semaphore"), ("threading", "Event"),
    ("threading", "Barrier"), ("multiprocessing.process", "BaseProcess"),
    ("multiprocessing.connection", "Connection"), ("multiprocessing.synchronize", "SemLock"),
    ("multiprocessing.pool", "Pool"), ("concurrent.futures", "Executor"), ("asyncio", "AbstractEventLoop"),
    ("sqlite3", "Connection"), ("ssl", "SSLSocket"), ("ssl", "SSLObject"),
)
_WHAT = (("_iobase", "an open file or stream"), ("_temporaryfilewrapper", "an open file"), ("socket", "a socket"),
         ("thread", "a thread"), ("lock", "a lock"), ("rlock", "a lock"), ("_rlock", "a lock"),
         ("condition", "a lock"), ("semaphore", "a lock"), ("event", "a threading event"), ("popen", "a subprocess"),
         ("mmap", "a memory map"))

verdicts: dict[type, bool] = {}  # per type, filled by is_refused


def _refused_bases() -> tuple[type, ...]:
    out = []
    for module, name in _REFUSED:
        t = getattr(sys.modules.get(module), name, None)
        if isinstance(t, type):
            out.append(t)
    _thread = sys.modules.get("_thread")
    if _thread is not None:
        out.append(type(_thread.allocate_lock()))
    return tuple(out)


def is_refused(t: type) -> bool:
    """Whether instances of ``t`` must not be pickled into an entry (cached per type)."""
    verdict = verdicts.get(t)
    if verdict is None:
        try:
            verdict = issubclass(t, _refused_bases())
        except TypeError:
            verdict = False
        verdicts[t] = verdict
    return verdict


def refusal(obj: Any, where: str | None) -> str:
    """Why a result holding ``obj`` (found at ``where``) is not cached, and what to do."""
    t = type(obj)
    names = {b.__name__.lower() for b in t.__mro__}
    what = next((w for n, w in _WHAT if n in names), "a live system resource")
    at = f" at {where}" if where else ""
    return (f"the result holds {what} ({t.__module__}.{t.__qualname__}{at}); results holding open files, sockets, "
            f"threads, locks or subprocesses are not cached, because no copy of one is the object the plain call "
            f"returned (and reopening a file can truncate it). Return it separately from what you cache.")


def find_path(root: Any, target: Any, root_name: str = "result") -> str | None:
    """Where ``root`` holds ``target`` (``result.a['b'][0]``), by a breadth-first walk over containers,
    ``__dict__`` and ``__slots__``; None if not found within :data:`MAX_PATH_SEARCH` objects."""
    if root is target:
        return root_name
    seen = {id(root)}
    todo = deque([(root, root_name)])
    while todo and len(seen) < MAX_PATH_SEARCH:
        obj, path = todo.popleft()
        for step, child in _edges(obj):
            if child is target:
                return path + step
            if id(child) not in seen and not isinstance(child, (str, bytes, int, float, type(None))):
                seen.add(id(child))
                todo.append((child, path + step))
    return None


def _edges(obj: Any):
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield f"[{k!r}]", v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(list(obj)):
            yield f"[{i}]", v
        return
    if isinstance(obj, (set, frozenset)):
        for v in list(obj):
            yield "{…}", v
        return
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        for name, v in list(d.items()):
            if name in ("_modules", "_parameters", "_buffers") and isinstance(v, dict):
                for k, sub in list(v.items()):  # nn.Module children read as attributes, as users write them
                    yield f".{k}", sub
            else:
                yield f".{name}", v
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            try:
                yield f".{name}", object.__getattribute__(obj, name)
            except AttributeError:
                pass
