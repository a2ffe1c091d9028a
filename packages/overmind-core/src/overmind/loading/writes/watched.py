"""The containers a loader may write outside its result, and how each is found again by name (its module and global,
or its class): in every imported module but the standard library's, torch's, ``regex``'s, Overmind's and
``__main__``, the globals, module-level dicts, sets, lists and weak containers, and each defined class's attributes;
attributes libraries make again when missing are not replayed.

Watched, in every imported module but the standard library's, Overmind's own and the program's ``__main__``: the
module's globals; each module-level dict (and subclass: ``OrderedDict``, a library's registry class), set and list;
each ``WeakKeyDictionary``, ``WeakValueDictionary`` and ``WeakSet``; and the attributes of each class the module
defines. A :class:`Place` names a container the way another process finds it (module, global name or class
qualname) and knows how to write it there as the plain call wrote it here.

The list is built once per process and extended as modules are imported (:func:`current`); a module whose globals
changed is looked at again, so a container bound to a new name is watched from then on. Modules first imported
during a call have no state from before it and are not watched for that call: their containers are as their import
made them, which a hit's own import of them makes again.
"""
from __future__ import annotations

import gc
import itertools
import operator
import sys
import threading
import weakref
from types import ModuleType
from typing import Any

from ...entries.writes import Place
from ...native import zerocopy

_SKIPPED_TOP = frozenset(sys.stdlib_module_names) | {"overmind", "__main__", "__mp_main__", "_pytest", "pytest",
                                                      "pluggy", "hypothesis", "coverage", "dill"}
# Overmind's own adapter packages (overmind_transformers, overmind_hf, ...): Overmind's state, not a library's. A
# load may import one of their submodules first (overmind_transformers.tokenizer_reduce, as a tokenizer is stored),
# which binds it in the package's globals: not a write of the loader, and a module cannot be pickled by value.
_SKIPPED_PREFIX = "overmind_"
# torch's own modules: what a load writes there is torch's lazy machinery, made again by the same first use or import
# in a process that only hit: dynamo's wrappers of the optimizers as it is imported, the operator registries (mirrored
# in the C++ dispatcher, which no write of a Python object restores), TorchScript's tables keyed by this process's
# object ids, pytree registrations of output classes as they are made. (torch's process state that decides a result,
# default dtype and device, modes, is the key's: keys/torch_state.py.)
_TORCH = "torch"
# Libraries whose module state is only caches of what they compute (the ``regex`` package's compiled patterns, evicted
# when full): nothing a hit needs, and an eviction would read as a registry losing an item.
_CACHES_ONLY = frozenset({"regex"})


class Watched:
    """The watched containers of this process: ``dicts`` (the raw dict of each, marked by :mod:`.marks`) with
    their ``dict_places``, and the sets and lists (``others``, copied) with their ``other_places``."""

    def __init__(self) -> None:
        self.dicts: list[dict] = []
        self.dict_places: list[Place | None] = []
        self.others: list[Any] = []
        self.other_places: list[Place | None] = []
        self.modules: dict[str, tuple[ModuleType, int]] = {}  # name -> (module, its globals' count when looked at)
        self.generation = 0  # grows whenever the lists change
        self.appended_since: int | None = None  # the generation whose lists these extend
        self._ids: set[int] = set()  # of every container watched: one bound to two names is watched once
        self._seen_modules = -1  # len(sys.modules) at the last refresh
        self._positions: dict[str, list[tuple[bool, int]]] = {}  # module -> (in dicts?, index) of its containers
        self._stale: set[str] = set()  # modules whose globals a load rebound: looked at again at the next refresh

    def stale(self, module: str) -> None:
        """A load rebound globals of ``module``: a container bound to a new name is watched from the next refresh."""
        self._stale.add(module)

    def refresh(self) -> None:
        """Watch the modules imported since the last refresh, and look again at those whose globals changed size
        or a load rebound."""
        if len(sys.modules) == self._seen_modules and not self._stale:
            return
        self._seen_modules = len(sys.modules)
        stale, self._stale = self._stale, set()
        changed = False
        for name, module in list(sys.modules.items()):
            top = name.partition(".")[0]
            if (top in _SKIPPED_TOP or top == _TORCH or top in _CACHES_ONLY or top.startswith(_SKIPPED_PREFIX)
                    or not isinstance(module, ModuleType)):
                continue
            try:
                namespace = object.__getattribute__(module, "__dict__")
            except AttributeError:
                continue
            if type(namespace) is not dict:
                continue
            seen = self.modules.get(name)
            if seen is not None and seen[0] is module and seen[1] == len(namespace) and name not in stale:
                continue
            if seen is not None:
                self._forget(name, namespace)
            self.modules[name] = (module, len(namespace))
            self._add_module(name, namespace)
            changed = True
        if changed:
            self.appended_since = self.generation
            self.generation += 1

    def _forget(self, module: str, namespace: dict) -> None:
        """Stop watching what ``module`` no longer binds to the name it was watched under (the entry stays, so the
        lists keep their order; a place of None is skipped)."""
        bound = {id(v) for v in namespace.values()} | {id(namespace)}
        for is_dict, i in self._positions.get(module, ()):
            places, items = (self.dict_places, self.dicts) if is_dict else (self.other_places, self.others)
            place = places[i]
            if place is not None and id(_bound_object(items[i], place)) not in bound:
                places[i] = None
                self._ids.discard(id(items[i]))

    def _add_dict(self, d: dict, place: Place) -> None:
        if id(d) not in self._ids:
            self._ids.add(id(d))
            self._positions.setdefault(place.module, []).append((True, len(self.dicts)))
            self.dicts.append(d)
            self.dict_places.append(place)

    def _add_other(self, container: Any, place: Place) -> None:
        if id(container) not in self._ids:
            self._ids.add(id(container))
            self._positions.setdefault(place.module, []).append((False, len(self.others)))
            self.others.append(container)
            self.other_places.append(place)

    def _add_module(self, module: str, namespace: dict) -> None:
        self._add_dict(namespace, Place("globals", module))
        scan = zerocopy.module_scan() or _scan
        for kind, name, value in scan(namespace, module, _KINDS, _kind_of):
            if kind == "dict" or kind == "class":
                self._add_dict(value, Place(kind, module, name))
            elif kind == "set" or kind == "list":
                self._add_other(value, Place(kind, module, name))
            else:  # a weak container: its data
                data = value.__dict__.get("data")
                if kind == "weakset" and type(data) is set:
                    self._add_other(data, Place(kind, module, name))
                elif kind != "weakset" and type(data) is dict:
                    self._add_dict(data, Place(kind, module, name))


def _scan(namespace: dict, module: str, kinds: dict[type, str], classify: Any) -> list[tuple[str, str, Any]]:
    """``(kind, name, container)`` of the containers among a module's globals (``csrc/module_scan.cpp`` is its
    compiled twin): the kind of each value by its type() (a lazy module's proxy must not be asked its
    ``__class__``), looked up in C over the thousands of values; a class's container is its attributes' dict."""
    names, values = list(namespace), list(namespace.values())
    found = list(map(kinds.get, map(type, values)))
    out = []
    for index in itertools.compress(range(len(found)), map(operator.ne, found, itertools.repeat("other"))):
        name, value = names[index], values[index]
        kind = found[index] or classify(type(value))
        if kind == "other" or not isinstance(name, str) or (name.startswith("__") and kind != "class"):
            continue  # a module's own dunders (__warningregistry__, __all__, __annotations__) are no registries
        if kind != "class":
            out.append((kind, name, value))
        elif value.__dict__.get("__module__") == module and getattr(value, "__qualname__", None) == name:
            attributes = _class_dict(value)  # defined here under this name: not an alias, not a nested class
            if attributes is not None:
                out.append((kind, name, attributes))
    return out


_KINDS: dict[type, str] = {}  # a value's type -> what kind of container it is ("other": none watched)


def _kind_of(kind: type) -> str:
    if issubclass(kind, dict):
        found = "dict"
    elif issubclass(kind, set):
        found = "set"
    elif issubclass(kind, list):
        found = "list"
    elif issubclass(kind, weakref.WeakKeyDictionary):
        found = "weakkeys"
    elif issubclass(kind, weakref.WeakValueDictionary):
        found = "weakvalues"
    elif issubclass(kind, weakref.WeakSet):
        found = "weakset"
    elif issubclass(kind, type):
        found = "class"
    else:
        found = "other"
    _KINDS[kind] = found
    return found


def _bound_object(container: Any, place: Place) -> Any:
    """What the module binds for a watched container: the class for its attributes, the weak container for its data
    (found by identity among the module's values)."""
    if place.kind in ("class", "weakkeys", "weakvalues", "weakset"):
        module = sys.modules.get(place.module)
        value = getattr(module, place.name, None) if module is not None and place.name else None
        return value if value is not None else container
    return container


def _class_dict(cls: type) -> dict | None:
    """The dict behind a class's ``__dict__`` mappingproxy (read only to mark it; writes go through setattr)."""
    referents = gc.get_referents(cls.__dict__)
    return referents[0] if len(referents) == 1 and type(referents[0]) is dict else None


# Attributes and globals a library sets on first use and sets again whenever it finds them missing, so a process
# that only hit makes them as plain's does, when it needs them; they are not writes to replay:
# - copyreg's cache of a class's slot names (any class);
# - tqdm's lock and monitor thread, made with the first progress bar (any class of tqdm);
# - transformers' tables built on first use (``if CACHE is None: CACHE = build()``): the checkpoint conversion
#   mapping and the Hub kernels' mapping (hundreds of KB each, that every entry would carry).
_IGNORED_EVERYWHERE = frozenset({"__slotnames__"})
# What the warnings module notes of the warnings a module's code issued: the loader's warnings are recorded and issued
# again by loading/replay/loader_warnings.py, through the hit process's own registries, as plain issues them.
_IGNORED_GLOBALS = frozenset({"__warningregistry__"})
_IGNORED_BY_LIBRARY = {"tqdm": frozenset({"_lock", "monitor", "_instances", "mp_lock", "th_lock"})}
_IGNORED_BY_PLACE = {
    ("globals", "transformers.conversion_mapping", ""): frozenset({"_checkpoint_conversion_mapping_cache"}),
    ("globals", "transformers.integrations.hub_kernels", ""): frozenset({"_KERNEL_MAPPING_CACHE"}),
}


def ignored(place: Place) -> frozenset:
    """The names among a class's attributes or a module's globals (``place``) that are not replayed."""
    found = _IGNORED_BY_PLACE.get((place.kind, place.module, place.name), frozenset())
    if place.kind == "globals":
        found = found | _IGNORED_GLOBALS
    if place.kind == "class":
        found = found | _IGNORED_EVERYWHERE | _IGNORED_BY_LIBRARY.get(place.module.partition(".")[0], frozenset())
    return found


_lock = threading.Lock()
_watched: Watched | None = None


def current() -> Watched:
    """This process's watched containers, brought up to date with the imported modules."""
    global _watched
    with _lock:
        if _watched is None:
            _watched = Watched()
        _watched.refresh()
        return _watched
