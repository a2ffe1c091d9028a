"""Where an Overmind load spends its time: inclusive timers around the steps of ``overmind.loading`` and ``.entries``.

Installed by a scenario process in Overmind mode (``child.start``). Each timer counts only the outermost
call of its step (a nested load inside a load is not counted twice) and sums over every load in the
process. Steps nest: ``publish`` contains ``pickle``, ``dedup`` (keying, the server's ``blobs`` lookup and the
byte compares of storages another entry may hold), ``write_entry``, ``server_publish`` and the final
``rebuild``; ``rebuild`` contains ``map`` and ``unpickle``. What no step covers in a cold load (its total
minus ``key``, ``server_get`` and ``publish``) is the library's own loader running inside Overmind.
``load`` is an ``overmind.load`` call from its key on (get, the loader on a miss, publish, rebuild);
``server_spawn`` is a first load's spawn of a server holding its key (``launcher.start_holding``: the
server's start then overlaps the loader; the publish's ``server_start`` waits for whatever is left of it);
``collector`` is the time Python's garbage collector ran inside ``key`` or ``load`` (``gc.callbacks``; in a cold load that includes the collections of the library's own loader),
``collector_outside`` the collections elsewhere in the process after :func:`install`.

This wraps module attributes that ``overmind.loading`` and ``overmind.entries`` look up at call time; a step that
is renamed in the core is skipped (and reported missing), never an error.
"""
from __future__ import annotations

import functools
import gc
import importlib
import time

# step name -> (module, attribute path)
STEPS = {
    "load": ("overmind.loading.flow", "_cached_call"),
    "key": ("overmind.keys.key", "make_key"),
    "server_start": ("overmind.client.launcher", "ensure_server"),
    "server_spawn": ("overmind.client.launcher", "start_holding"),
    "server_get": ("overmind.client.connection", "Client.get"),
    "publish": ("overmind.loading.publish", "publish"),
    "pickle": ("overmind.entries.pickling", "dumps"),
    "dedup": ("overmind.entries.dedup", "plan"),
    "write_entry": ("overmind.shm.writer", "write_entry"),
    "server_publish": ("overmind.client.connection", "Client.publish_hit"),
    "rebuild": ("overmind.entries.codec", "decode"),
    "map": ("overmind.shm.reader", "EntryMapping.__init__"),
    "unpickle": ("overmind.entries.pickling", "loads"),
}



class _Timers:
    """The timers' state, held as one object's attributes: Overmind's writes recorder watches module-level
    containers, and what the timers note while a loader runs (a collection, a nested load) is no write of the
    loader's."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.missing: list[str] = []
        self.depth: dict[str, int] = {}
        self.collection_start = 0.0


_timers = _Timers()


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        depth = _timers.depth.get(name, 0)
        _timers.depth[name] = depth + 1
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _timers.depth[name] = depth
            if depth == 0:
                _timers.totals[name] = _timers.totals.get(name, 0.0) + time.perf_counter() - t
                _timers.calls[name] = _timers.calls.get(name, 0) + 1

    return wrapper


def _collections(phase: str, info: dict) -> None:
    if phase == "start":
        _timers.collection_start = time.perf_counter()
        return
    name = "collector" if _timers.depth.get("load", 0) or _timers.depth.get("key", 0) else "collector_outside"
    totals, calls = _timers.totals, _timers.calls
    totals[name] = totals.get(name, 0.0) + time.perf_counter() - _timers.collection_start
    calls[name] = calls.get(name, 0) + 1
    if info.get("generation") == 2:
        calls[name + "_full"] = calls.get(name + "_full", 0) + 1


def install() -> None:
    """Wrap every step in :data:`STEPS` that exists, and time the garbage collector's runs."""
    if _collections not in gc.callbacks:
        gc.callbacks.append(_collections)
    for name, (module, path) in STEPS.items():
        try:
            owner = importlib.import_module(module)
            *outer, attr = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            setattr(owner, attr, _timed(name, getattr(owner, attr)))
        except (ImportError, AttributeError):
            _timers.missing.append(name)


def result() -> dict:
    """The totals (seconds) and call counts so far, for the scenario's report."""
    return {"totals": dict(_timers.totals), "calls": dict(_timers.calls), "missing": list(_timers.missing)}
