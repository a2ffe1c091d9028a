"""Objects rebuilt ahead of the call that wants them (an ``overmind run`` template's, taken by its children): taken
once, only for the entry the server just answered, with the call's own arguments put where the placeholders were.

A template builds the objects of the entries its children hit most (:mod:`overmind.runner.prebuild`) and holds
them here, each with the id of the entry it was rebuilt from. A child forked from the template has a
copy-on-write copy of the whole table, so an object taken from it is the child's own, a fresh object in the
child's address space as a fresh unpickle would make it, without the unpickling.

A hit takes an object only when the server has just answered that very entry for the call's key
(:func:`take`: the same ``entry_id``), so an object whose entry was evicted, replaced or invalidated since the
template built it is never served: the hit rebuilds from the entry as always. Each object is taken once: a second
call for the same key in the same process gets a new object, as the plain call would.

An entry that holds objects of the call's arguments (``pipe.vae is vae``) is built with a placeholder for each
(:class:`~overmind.entries.arguments_ref.Placeholder`), every reference to it found (:func:`places`: only
dicts' values, lists' items and objects' attributes, and only if that accounts for every reference), and the
taking call's own objects are put there, checked as a rebuild checks them. Paths the entry records as derived
from the call's arguments are written as the taking call spells them (:mod:`.path_spellings`).

>>> held = take(ck.key, res.entry["entry_id"], arguments)      # in the load flow's hit, before decoding
>>> obj = codec.decode(...) if held is NOTHING else held
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Any, NamedTuple

from . import arguments_ref

NOTHING = object()  # what take() returns when no object is held for the entry (None is an object)


class Held(NamedTuple):
    """An object built ahead, and where the call's arguments go into it."""

    entry_id: str
    obj: Any
    placeholders: list  # arguments_ref.Placeholder, one per argument the rebuild met
    places: list  # (container, key or index, placeholder number): every reference to a placeholder
    aliases: list  # the entry's argument_aliases, checked against the call's arguments
    environment: dict  # variables the rebuild read, with their values: taken only where they are the same
    spellings: list  # the entry's places of paths derived from the call's arguments (path_spellings.record)


_held: dict[str, Held] = {}  # cache key -> what is held for it
_taken = 0  # objects this process took


def take(key: str, entry_id: str, arguments: dict | None = None) -> Any:
    """The object held for ``key`` if it was rebuilt from entry ``entry_id``, removed from the table, with this
    call's ``arguments`` put where the entry holds them; else :data:`NOTHING` (and an object of another entry under
    that key is dropped). Raises :class:`~overmind.entries.arguments_ref.ArgumentMismatch` where the call's
    arguments do not fit, as a rebuild would."""
    global _taken
    if not _held:
        return NOTHING
    held = _held.pop(key, None)
    if held is None or held.entry_id != entry_id:
        return NOTHING
    if any(os.environ.get(name) != value for name, value in held.environment.items()):
        return NOTHING  # the rebuild read a variable this process has otherwise: a rebuild here reads its own
    if held.placeholders:
        arguments_ref.check_aliases(arguments, held.aliases)
        values = [placeholder.resolve(arguments) for placeholder in held.placeholders]
        for container, slot, number in held.places:
            (dict if isinstance(container, dict) else list).__setitem__(container, slot, values[number])
    if held.placeholders or held.spellings:
        from . import codec, path_spellings

        path_spellings.respell(held.obj, held.spellings, arguments)
        # as the object it now is, with the call's own objects and spellings
        codec.remember_origin(held.obj, key, arguments)
    _taken += 1
    return held.obj


def taken() -> int:
    """How many objects this process took (:func:`take`)."""
    return _taken


def hold(key: str, entry_id: str, obj: Any, placeholders: list | None = None, aliases: list | None = None,
         environment: dict | None = None, spellings: list | None = None) -> None:
    """Keep ``obj``, rebuilt from entry ``entry_id`` of ``key``, for a later :func:`take`; ``placeholders``: the
    arguments the rebuild met (:func:`places` must have found where each one is); ``environment``: the variables
    the rebuild read, with their values; ``spellings``: the entry's meta ``spellings``, written as the taking call
    spells its arguments."""
    found = places(obj, placeholders or [])
    if isinstance(found, str):
        raise ValueError(found)
    _held[key] = Held(entry_id, obj, list(placeholders or []), found, list(aliases or []), dict(environment or {}),
                      list(spellings or []))


def places(obj: Any, placeholders: list) -> list | str:
    """Every ``(container, key or index, placeholder number)`` that holds one of ``placeholders`` in the objects a
    rebuild made, or why some reference cannot be put back: held by a tuple, a set, a dict key, an object's slot,
    or anything the collector cannot see (the placeholder's reference count says so)."""
    if isinstance(obj, arguments_ref.Placeholder):
        return "the result is one of the call's own arguments"
    found: list = []
    for number in range(len(placeholders)):
        count = 0
        for ref in gc.get_referrers(placeholders[number]):
            if ref is placeholders:
                continue
            if isinstance(ref, dict):
                if any(k is placeholders[number] for k in dict.keys(ref)):
                    return "an argument is a key of a dict"
                slots = [k for k, v in dict.items(ref) if v is placeholders[number]]
            elif isinstance(ref, list):
                slots = [i for i, v in enumerate(list.__iter__(ref)) if v is placeholders[number]]
            elif isinstance(getattr(ref, "__dict__", None), dict):
                # an attribute kept in the object itself (CPython 3.11 keeps a dict only once asked for one):
                # its __dict__ is the place; a slot beside it leaves the count short, below
                ref = ref.__dict__
                slots = [k for k, v in dict.items(ref) if v is placeholders[number]]
            else:
                return f"an argument is held by a {type(ref).__name__}, where it cannot be put back"
            found.extend((ref, slot, number) for slot in slots)
            count += len(slots)
        # references: the list of placeholders, getrefcount's own argument, and each place found
        if sys.getrefcount(placeholders[number]) - 2 != count:
            return "an argument is held where the collector does not see it"
    return found


def drop(key: str) -> None:
    """Forget the object held for ``key``, if any."""
    _held.pop(key, None)


def held() -> dict[str, str]:
    """``{key: entry_id}`` of every object held."""
    return {key: h.entry_id for key, h in _held.items()}


def objects() -> list:
    """The objects held, in no particular order."""
    return [h.obj for h in _held.values()]
