"""A miss's writes as its entry keeps them (:func:`for_entry`), and taken back and made again around the check of
the call's key (:func:`undo`, :func:`redo`); ``entries/writes.py`` pickles them with the result and replays them.

A value the loader found rather than made (a class attribute such as a model class's ``_can_record_outputs``, a
module global) is kept as where it was found (``Named``), so the hit stores that very object, as plain does. A
class or an importable function is kept by name by pickle itself. Any other value is pickled by value, in one stream
with the result: an object of the result is the rebuilt object, any other one an object the loader made for the
write.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ...entries.writes import ABSENT, Named, apply, stored
from .changes import Write

_ATOMS = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis))


def for_entry(writes: list[Write], result: Any) -> list[tuple]:
    """``writes`` as an entry keeps them: ``(place, key, value)`` with found values as :class:`Named`."""
    written = {(id(w.place.find()), w.key) for w in writes if w.place.kind in ("class", "globals")}
    index = _FoundValues(result, written, {w.place.module for w in writes})
    return [(w.place, _as_kept(w.key, index), _as_kept(w.value, index)) for w in writes]


def _is_atom(value: Any) -> bool:
    if type(value) in _ATOMS:
        return True
    if type(value) in (tuple, frozenset):
        return all(_is_atom(v) for v in value)
    return False


def _as_kept(value: Any, index: _FoundValues) -> Any:
    if _is_atom(value) or isinstance(value, type) or _by_name(value):
        return value  # pickle keeps classes and importable functions by name already
    found = index.lookup(value)
    return Named(*found) if found is not None else value


def _by_name(value: Any) -> bool:
    """Whether pickle refers to ``value`` by its module and qualname (a function, a module-level object)."""
    module = getattr(type(value), "__module__", None)
    if module != "builtins" or not callable(value):
        return False
    name, owner = getattr(value, "__qualname__", None), sys.modules.get(getattr(value, "__module__", "") or "")
    if not isinstance(name, str) or owner is None or "<" in name:
        return False
    obj: Any = owner
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj is value


class _FoundValues:
    """Where values that already existed can be found by name, looked up by identity: the attributes of the result's
    classes (and their bases), and the globals of the modules the writes went to."""

    def __init__(self, result: Any, written: set[tuple[int, Any]], modules: set[str]) -> None:
        # written: (id of a class or module, attribute) that the writes themselves set: not where a value was found
        self._result, self._written, self._modules = result, written, modules
        self._index: dict[int, tuple[Any, str]] | None = None

    def lookup(self, value: Any) -> tuple[Any, str] | None:
        if self._index is None:
            self._index = {}
            owners: list[Any] = [sys.modules[m] for m in sorted(self._modules) if m in sys.modules]
            for cls in _classes_of(self._result):
                owners.extend(reversed(cls.__mro__))
            for owner in owners:
                for name, attr in list(vars(owner).items()):
                    if not _is_atom(attr) and isinstance(name, str) and (id(owner), name) not in self._written:
                        self._index.setdefault(id(attr), (owner, name))
        return self._index.get(id(value))


def _classes_of(result: Any) -> set[type]:
    """The classes of the result and of the modules it holds (a pipeline's components, a model's submodules)."""
    classes = {type(result)}
    modules = getattr(result, "modules", None)
    torch = sys.modules.get("torch")
    module_type = torch.nn.Module if torch is not None else None
    if module_type is not None and isinstance(result, module_type) and callable(modules):
        classes.update(type(m) for m in result.modules())
    elif module_type is not None:
        for value in list(getattr(result, "__dict__", {}).values()):
            if isinstance(value, module_type):
                classes.update(type(m) for m in value.modules())
    return classes


@contextlib.contextmanager
def taken_back(writes: list[Write]) -> Iterator[None]:
    """Inside, ``writes`` are taken back, last first (the state as the loader found it); after, made again as they
    were, whatever happened inside or while taking them back."""
    undone: list[Write] = []
    try:
        for w in reversed(writes):
            _undo(w)
            undone.append(w)
        yield
    finally:
        apply([(w.place, w.key, w.value) for w in reversed(undone)])


def take_back(writes: list[Write]) -> None:
    """Take ``writes`` back, last first: the state as the loader found it (the miss then makes the entry's writes,
    with the rebuilt objects in place of those the loader returned)."""
    for w in reversed(writes):
        _undo(w)


def _undo(w: Write) -> None:
    container = w.place.find()
    kind = w.place.kind
    if kind == "attrs":
        if w.before is ABSENT:
            container.__dict__.pop(w.key, None)
        else:
            container.__dict__[w.key] = w.before
    elif kind == "requires_grad":
        container.requires_grad_(w.before)
    elif kind == "dict" and w.before is not ABSENT:
        stored(type(container), "__setitem__")(container, w.key, w.before)
    elif kind in ("globals", "class"):
        if w.before is ABSENT:
            delattr(container, w.key)
        else:
            setattr(container, w.key, w.before)
    elif kind == "dict":
        stored(type(container), "__delitem__")(container, w.key)
    elif kind in ("weakkeys", "weakvalues"):
        del container[w.key]
    elif kind in ("set", "weakset"):
        container.discard(w.value)
    elif kind == "list":
        list.pop(container)
