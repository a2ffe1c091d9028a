"""Before and after a loader: the state of the watched containers (:class:`Before`: marks of the dicts, copies of
module globals and class attributes kept while their version tags hold, copies of sets and lists), and what changed
in it, as writes (:func:`since`); an item removed or replaced in a registry is a change a hit cannot make, and the
call is not cached.

A module's globals and a class's attributes are compared item by item with a copy taken before the call (kept
between calls while the dict's version tag shows it unchanged): each global or attribute added, rebound or deleted
is one write. Any other dict that gained items at its end while keeping the others (a registry filling up) gives
one write per item, in order. A set that gained items gives one write each. A list that kept its items and gained
some at its end gives one each. Anything else (a registry's item removed or replaced, a list reordered) is a
change that cannot be replayed: :func:`since` says which container.
"""
from __future__ import annotations

import operator
import sys
import weakref
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

from ...entries.writes import ABSENT, DELETED, Held
from . import marks, watched


@dataclass
class Write:
    """One item the loader added to a container: ``place`` names the container, ``key`` the dict key or attribute
    name (None for a set or list), ``value`` what was stored (the object itself, for a weak container)."""

    place: watched.Place | Held  # Held: a part of a module the call was given (writes/arguments.py)
    key: Any
    value: Any
    before: Any = ABSENT  # what a global or attribute held before the write


@dataclass
class Found:
    """What a loader wrote: its ``writes`` in order, or why they cannot be replayed (``unreplayable``)."""

    writes: list[Write] = field(default_factory=list)
    unreplayable: str | None = None


class Before:
    """The watched containers' state as a loader starts: marks of the dicts, copies of the sets and lists."""

    # (generation, implementation, marks) of the last one taken, for their digests
    _previous: tuple[int, Any, bytes] | None = None

    def __init__(self) -> None:
        self.watched = watched.current()
        previous = Before._previous
        reuse = None
        implementation = marks.implementation()
        if (previous is not None and previous[0] in (self.watched.generation, self.watched.appended_since)
                and previous[1] is implementation):
            reuse = previous[2]  # the same dicts at the same indexes (and maybe more after them)
        self.marks = marks.marks(self.watched.dicts, reuse)
        self.generation = self.watched.generation
        self.dicts = list(self.watched.dicts)
        self.dict_places = list(self.watched.dict_places)
        self.others = list(self.watched.others)
        self.other_places = list(self.watched.other_places)
        self.copies = [set.copy(o) if isinstance(o, set) else list.copy(o) for o in self.others]
        self.modules = set(sys.modules)
        self.itemwise = _itemwise_copies(self.dicts, self.dict_places, self.marks, self.generation)
        Before._previous = (self.generation, implementation, self.marks)

    def copy_of(self, index: int) -> dict | None:
        """The copy of the watched dict at ``index`` as the loader started, if it is compared item by item."""
        kept = _copies.get(id(self.dicts[index])) if index in self.itemwise else None
        return kept[1] if kept is not None else None


_ITEMWISE = ("globals", "class")
_copies: dict[int, tuple[int, dict]] = {}  # id of a watched dict -> (its version tag, a copy taken at that version)


_copied: tuple[int, list[int], Any] | None = None  # (generation, indexes copied, their versions) of the last call


def _itemwise_copies(dicts: list[dict], places: list[watched.Place | None], at: bytes,
                     generation: int) -> frozenset[int]:
    """Bring the copies of the module globals and class attributes among ``dicts`` up to date, reusing a copy from
    an earlier call while the dict's version tag has not moved (a tag of 0: none known, copied anew); returns their
    indexes."""
    global _copied
    versions = marks.versions(at)
    if _copied is not None and _copied[0] == generation:
        indexes = _copied[1]
        moved = marks.moved(_copied[2], versions, indexes)
    else:  # other lists: each dict's copy is looked up by the dict and its version
        indexes = [i for i, place in enumerate(places) if place is not None and place.kind in _ITEMWISE]
        moved = [i for i in indexes if _stale_copy(dicts[i], int(versions[i]))]
    for index in moved:
        d = dicts[index]
        _copies[id(d)] = (int(versions[index]), dict.copy(d))
    _copied = (generation, indexes, versions)
    return _copied_set(generation, indexes)


def _stale_copy(d: dict, version: int) -> bool:
    kept = _copies.get(id(d))
    return kept is None or kept[0] != version or version == 0


_indexes: tuple[int, frozenset[int]] | None = None


def _copied_set(generation: int, indexes: list[int]) -> frozenset[int]:
    global _indexes
    if _indexes is None or _indexes[0] != generation:
        _indexes = (generation, frozenset(indexes))
    return _indexes[1]


def since(before: Before) -> Found:
    """What changed in the containers ``before`` watched since it was taken, less what the imports the loader made
    did (:func:`_by_imports`)."""
    found = _since(before)
    if found.unreplayable is None:
        found.writes = _by_imports(found.writes, set(sys.modules) - before.modules)
    return found


def _by_imports(writes: list[Write], imported: set[str]) -> list[Write]:
    """``writes`` without those that name a module, or a class, function or other callable of a module first
    imported during the call: what that import did (a class registering itself with torch's pytree as it is made,
    numpy's dispatchers registering themselves as numpy.fft is imported) or a lazy module's cache of its attributes;
    a hit's rebuild imports the modules its objects need, which does it again, and replaying it would import every
    module the miss happened to import."""
    files = {getattr(sys.modules.get(name), "__file__", None) for name in imported} - {None}

    def made_by_import(obj: Any) -> bool:
        if isinstance(obj, ModuleType):
            return True
        if not callable(obj) or isinstance(obj, (str, bytes)):
            return False
        # a class, function or dispatcher by the module it names, or a function whose module names another (numpy's
        # public ones) by its file
        module = getattr(obj, "__module__", None)
        return (isinstance(module, str) and module in imported) or (
            isinstance(obj, FunctionType) and obj.__code__.co_filename in files)

    if not imported:
        return writes
    return [w for w in writes if not (made_by_import(w.key) or made_by_import(w.value))]


def _since(before: Before) -> Found:
    found = Found()
    after = marks.marks(before.dicts, before.marks)
    for index in marks.changed(before.marks, after):
        d, place = before.dicts[index], before.dict_places[index]
        if place is None:
            continue  # no longer bound where it was watched
        then = before.copy_of(index)
        if then is not None:
            _add_itemwise(found, place, then, d, before.watched)
            continue
        gained = marks.appended(d, before.marks, index)
        if gained is None:
            found.unreplayable = f"it removed or replaced an item of {place.describe()}"
            return found
        for key in list(d)[len(d) - gained:]:
            _add_dict_write(found, place, key, d[key])
    for other, now, kept in zip(before.other_places, before.others, before.copies):
        if other is None:
            continue
        if isinstance(kept, set):
            if now != kept:
                if not kept <= now:
                    found.unreplayable = f"it removed an item of {other.describe()}"
                    return found
                for item in now - kept:
                    _add_set_write(found, other, item)
        else:  # a list: its items as they were (zip stops at the shorter), then any it gained
            if len(now) < len(kept) or not all(map(operator.is_, now, kept)):
                found.unreplayable = f"it removed or replaced an item of {other.describe()}"
                return found
            for item in now[len(kept):]:
                found.writes.append(Write(other, None, item))
    return found


def _add_itemwise(found: Found, place: watched.Place, then: dict, now: dict, watching: watched.Watched) -> None:
    if place.kind == "globals":
        watching.stale(place.module)
    ignored = watched.ignored(place)
    # Overmind's own patches of a library's loaders and functions (an adapter patches some as their modules are
    # imported) are not the loader's writes
    from ...adapters import patching

    owner = place.find()
    ignored = ignored | {key for key in now.keys() ^ then.keys() | _rebound(then, now)
                         if isinstance(key, str) and patching.is_patched(owner, key)}
    for key, value in list(now.items()):
        if key not in ignored and (key not in then or then[key] is not value):
            found.writes.append(Write(place, key, value, then.get(key, ABSENT)))
    for key in then:
        if key not in now and key not in ignored:
            found.writes.append(Write(place, key, DELETED, then[key]))


def _rebound(then: dict, now: dict) -> set:
    return {key for key, value in now.items() if key in then and then[key] is not value}


def _add_dict_write(found: Found, place: watched.Place, key: Any, value: Any) -> None:
    if place.kind == "weakkeys":
        key = key() if isinstance(key, weakref.ref) else key
        if key is None:
            return  # its object is gone already: plain holds nothing for it either
    elif place.kind == "weakvalues":
        value = value() if isinstance(value, weakref.ref) else value
        if value is None:
            return
    found.writes.append(Write(place, key, value))


def _add_set_write(found: Found, place: watched.Place, item: Any) -> None:
    if place.kind == "weakset":
        item = item() if isinstance(item, weakref.ref) else item
        if item is None:
            return
    found.writes.append(Write(place, None, item))
