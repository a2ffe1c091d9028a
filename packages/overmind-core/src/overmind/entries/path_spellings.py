"""A hit names a path as its own call spelled it (``m``, ``./m`` and ``/abs/m/`` share an entry): the places where a
result holds a path derived from the call's argument, as the adapters name them, are recorded with the entry and
written on a hit as this call's argument gives them.

Calls that name one folder by different spellings (``m``, ``./m``, ``/abs/m``, ``/abs/m/``) share an entry: a key
describes the folder (its absolute path and files), not the string. Plain keeps each caller's spelling wherever
the library derives a string from the path (``model.config._name_or_path``, a pipeline component's
``<path>/unet``, a tokenizer's ``<path>/vocab.txt``). So an entry records those places, as the adapters name
them (``overmind_derived_paths``), and a hit writes there what its own argument gives (:func:`respell`).

A place is recorded only where its value is derived from the publishing call's argument in one of the ways the
libraries derive it (:func:`record`):

- ``given``: the argument itself (diffusers keeps a ``Path`` as a ``Path``);
- ``str``: ``str()`` of a ``pathlib`` argument (transformers keeps ``str(path)``);
- ``joined``: ``os.path.join(argument, tail)`` (a component's folder, a file found in the folder).

Only ``str`` and ``pathlib`` arguments are respelled: a key describes any other ``os.PathLike`` by its state too,
so two spellings of one never share an entry. A place inside an object the call was given is the caller's own
(the entry references that object, :mod:`.arguments_ref`) and is never recorded.
"""
from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable, Mapping

from ..adapters.derived_paths import DerivedPath
from ..errors import OvermindError
from . import arguments_ref

_MISSING = object()


class Unplaced(OvermindError):
    """The rebuilt result lacks a place where its entry records a path (the entry does not fit what it rebuilt)."""


def record(result: Any, places: Iterable[DerivedPath], arguments: Mapping[str, Any] | None) -> list[dict]:
    """The entry's record (JSON-ready) of each of ``places`` whose value in ``result`` the call's ``arguments``
    derive; a place reached twice is recorded once."""
    out: list[dict] = []
    index: arguments_ref.ArgumentIndex | None = None
    done: set[tuple[int, Any]] = set()
    for place in places:
        if not isinstance(place, DerivedPath):
            raise TypeError(f"an adapter's overmind_derived_paths returned {place!r}: return "
                            f"overmind.adapter.DerivedPath records")
        spelled: Any = (arguments or {}).get(place.argument)
        if not _respellable(spelled):
            continue
        if index is None:
            index = arguments_ref.ArgumentIndex(dict(arguments or {}))
        holder = _holder(result, place.steps, place.item, index)
        if holder is None or (id(holder), place.key) in done:
            continue
        derived = _derivation(dict.get(holder, place.key, _MISSING), spelled)
        if derived is None:
            continue
        done.add((id(holder), place.key))
        out.append({"steps": [list(step) for step in place.steps], "key": place.key, "item": place.item,
                    "argument": place.argument, **derived})
    return out


def respell(result: Any, records: Iterable[Mapping[str, Any]] | None, arguments: Mapping[str, Any] | None) -> None:
    """Write at each recorded place of ``result`` the path this call's ``arguments`` derive there. Raises
    :class:`~overmind.entries.arguments_ref.ArgumentMismatch` where the call does not pass the argument as a
    ``str`` or ``pathlib`` path, :class:`Unplaced` where the result lacks the place."""
    for rec in records or ():
        spelled: Any = (arguments or {}).get(rec["argument"])
        if not _respellable(spelled):
            raise arguments_ref.ArgumentMismatch(
                f"the cached result holds paths derived from argument {rec['argument']!r}, which this call does "
                f"not pass as a str or pathlib path")
        holder = _reach(result, rec["steps"], rec["item"])
        dict.__setitem__(holder, rec["key"], _spelling(rec, spelled))


def _respellable(value: Any) -> bool:
    return type(value) is str or isinstance(value, pathlib.PurePath)


def _derivation(value: Any, spelled: str | pathlib.PurePath) -> dict | None:
    """How ``value`` derives from ``spelled``, as the entry records it, or None where it does not."""
    if type(value) is type(spelled) and value == spelled:
        return {"as": "given"}
    if type(value) is not str:
        return None
    if value == str(spelled):
        return {"as": "str"}
    base = os.path.join(spelled, "")
    tail = value[len(base):]
    if value.startswith(base) and os.path.join(spelled, tail) == value:  # (not a tail that join would restart at)
        return {"as": "joined", "tail": tail}
    return None


def _spelling(rec: Mapping[str, Any], spelled: str | pathlib.PurePath) -> Any:
    """The value a recorded place takes for this call's ``spelled`` argument."""
    form = rec["as"]
    if form == "given":
        return spelled
    if form == "str":
        return str(spelled)
    return os.path.join(spelled, rec["tail"])


def _holder(result: Any, steps: Iterable, item: bool, index: arguments_ref.ArgumentIndex) -> dict | None:
    """The dict holding a place in the loader's ``result``, or None where it is absent or lies in an object the
    call was given."""
    try:
        return _reach(result, steps, item, index)
    except Unplaced:
        return None


def _reach(root: Any, steps: Iterable, item: bool, index: arguments_ref.ArgumentIndex | None = None) -> dict:
    """The dict ``steps`` lead to from ``root`` (the object's ``__dict__`` unless ``item``). With an ``index``, an
    object the call was given on the way raises :class:`Unplaced`."""
    obj = root
    for kind, at in steps:
        _not_given(obj, index)
        obj = _attribute(obj, at) if kind == "attr" else _item(obj, at)
    _not_given(obj, index)
    holder = obj if item else _attributes(obj)
    if not isinstance(holder, dict):
        raise Unplaced(f"a path's place is in a {type(holder).__name__}, not a dict")
    return holder


def _not_given(obj: Any, index: arguments_ref.ArgumentIndex | None) -> None:
    if index is not None and index.path_of(obj) is not None:
        raise Unplaced("the place lies in an object the call was given")


def _attribute(obj: Any, name: Any) -> Any:
    attributes = _attributes(obj)
    if name not in attributes:
        raise Unplaced(f"a {type(obj).__name__} has no attribute {name!r}")
    return attributes[name]


def _attributes(obj: Any) -> dict:
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict):
        raise Unplaced(f"a {type(obj).__name__} keeps no attributes in a __dict__")
    return attributes


def _item(obj: Any, at: Any) -> Any:
    try:
        if isinstance(obj, dict):
            return dict.__getitem__(obj, at)
        if isinstance(obj, list):
            return list.__getitem__(obj, at)
        if isinstance(obj, tuple):  # passed through, never written: a place is in a dict
            return tuple.__getitem__(obj, at)
    except (KeyError, IndexError, TypeError):
        pass
    raise Unplaced(f"a {type(obj).__name__} holds no item {at!r}")
