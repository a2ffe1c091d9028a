"""Objects rebuilt ahead of the call that wants them: an ``overmind run`` template's, taken by its children.

A template builds the objects of the entries its children hit most (:mod:`overmind.runner.prebuild`) and holds
them here, each with the id of the entry it was rebuilt from. A child forked from the template has a
copy-on-write copy of the whole table, so an object taken from it is the child's own, a fresh object in the
child's address space as a fresh unpickle would make it, without the unpickling.

A hit takes an object only when the server has just answered that very entry for the call's key
(:func:`take`: the same ``entry_id``), so an object whose entry was evicted, replaced or invalidated since the
template built it is never served: the hit rebuilds from the entry as always. Each object is taken once: a second
call for the same key in the same process gets a new object, as the plain call would.

>>> held = take(ck.key, res.entry["entry_id"])      # in the load flow's hit, before decoding
>>> obj = codec.decode(...) if held is NOTHING else held
"""
from __future__ import annotations

from typing import Any

NOTHING = object()  # what take() returns when no object is held for the entry (None is an object)

_held: dict[str, tuple[str, Any]] = {}  # cache key -> (entry_id, object)


def take(key: str, entry_id: str) -> Any:
    """The object held for ``key`` if it was rebuilt from entry ``entry_id``, removed from the table; else
    :data:`NOTHING` (and an object of another entry under that key is dropped)."""
    if not _held:
        return NOTHING
    held = _held.pop(key, None)
    if held is None or held[0] != entry_id:
        return NOTHING
    return held[1]


def hold(key: str, entry_id: str, obj: Any) -> None:
    """Keep ``obj``, rebuilt from entry ``entry_id`` of ``key``, for a later :func:`take`."""
    _held[key] = (entry_id, obj)


def drop(key: str) -> None:
    """Forget the object held for ``key``, if any."""
    _held.pop(key, None)


def held() -> dict[str, str]:
    """``{key: entry_id}`` of every object held."""
    return {key: entry_id for key, (entry_id, _obj) in _held.items()}
