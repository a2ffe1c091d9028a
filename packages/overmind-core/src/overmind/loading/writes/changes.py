"""Before and after a loader: the state of the watched containers (:class:`Before`), and what changed in it as
writes (:func:`since`).

A module's globals and a class's attributes are compared item by item with a copy taken before the call (kept
between calls while the dict's version tag shows it unchanged): each global or attribute added, rebound or deleted
is one write. Any other dict that gained items at its end while keeping the others (a registry filling up) gives
one write per item, in order. A set that gained items gives one write each. A list that kept its items and gained
some at its end gives one each. Anything else (a registry's item removed or replaced, a list reordered) is a
change that cannot be replayed: :func:`since` says which container.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from ...entries.writes import ABSENT, DELETED
from . import marks, watched


@dataclass
class Write:
    """One item the loader added to a container: ``place`` names the container, ``key`` the dict key or attribute
    name (None for a set or list), ``value`` what was stored (the object itself, for a weak container)."""

    place: watched.Place
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

    _previous: tuple[int, bytes] | None = None  # (generation, marks) of the last one taken, for their digests

    def __init__(self) -> None:
        self.watched = watched.current()
        previous = Before._previous
        reuse = previous[1] if previous is not None and previous[0] == self.watched.generation else None
        self.marks = marks.marks(self.watched.dicts, reuse)
        self.generation = self.watched.generation
        self.dicts = list(self.watched.dicts)
        self.dict_places = list(self.watched.dict_places)
        self.others = list(self.watched.others)
        self.other_places = list(self.watched.other_places)
        self.copies = [set(o) if isinstance(o, set) else list(o) for o in self.others]
        self.items = _itemwise_copies(self.dicts, self.dict_places, self.marks)
        Before._previous = (self.generation, self.marks)


_ITEMWISE = ("globals", "class")
_copies: dict[int, tuple[int, dict]] = {}  # id of a watched dict -> (its version tag, a copy taken at that version)


def _itemwise_copies(dicts: list[dict], places: list[watched.Place], at: bytes) -> dict[int, dict]:
    """Copies of the module globals and class attributes among ``dicts`` (by index), reused from an earlier call
    while the dict's version tag has not moved (a tag of 0: none known, copied anew)."""
    out = {}
    for index, (d, place) in enumerate(zip(dicts, places)):
        if place.kind not in _ITEMWISE:
            continue
        version = marks.MARK.unpack_from(at, index * marks.MARK.size)[0]
        kept = _copies.get(id(d))
        if kept is None or kept[0] != version or version == 0:
            kept = (version, dict.copy(d))
            _copies[id(d)] = kept
        out[index] = kept[1]
    return out


def since(before: Before) -> Found:
    """What changed in the containers ``before`` watched since it was taken."""
    found = Found()
    after = marks.marks(before.dicts, before.marks)
    for index in marks.changed(before.marks, after):
        d, place = before.dicts[index], before.dict_places[index]
        then = before.items.get(index)
        if then is not None:
            _add_itemwise(found, place, then, d)
            continue
        gained = marks.appended(d, before.marks, index)
        if gained is None:
            found.unreplayable = f"it removed or replaced an item of {place.describe()}"
            return found
        for key in list(d)[len(d) - gained:]:
            _add_dict_write(found, place, key, d[key])
    for place, now, then in zip(before.other_places, before.others, before.copies):
        if isinstance(then, set):
            if now != then:
                if not then <= now:
                    found.unreplayable = f"it removed an item of {place.describe()}"
                    return found
                for item in now - then:
                    _add_set_write(found, place, item)
        elif len(now) != len(then) or any(a is not b for a, b in zip(now, then)):
            if len(now) < len(then) or any(a is not b for a, b in zip(now, then)):
                found.unreplayable = f"it removed or replaced an item of {place.describe()}"
                return found
            for item in now[len(then):]:
                found.writes.append(Write(place, None, item))
    return found


def _add_itemwise(found: Found, place: watched.Place, then: dict, now: dict) -> None:
    ignored = watched.ignored(place)
    if place.kind == "class":  # Overmind's own patches of a library's loaders are not the loader's writes
        from ...adapters import patching

        cls = place.find()
        ignored = ignored | {key for key in now.keys() ^ then.keys() | _rebound(then, now)
                             if patching.is_patched(cls, key)}
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
