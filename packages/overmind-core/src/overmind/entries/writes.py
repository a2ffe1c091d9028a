"""The writes a loader made outside its result, as an entry holds them: pickled with the result in one stream
(:class:`Recorded`), so that a write storing an object of the result (a weak registry keyed by the model) stores the
rebuilt object, and made again on every rebuild (:func:`apply`) before the caller gets the result.

Each kind of container is written as plain writes it: a module global or a class attribute with ``setattr`` (which
also clears the interpreter's attribute caches); a dict item below any Python ``__setitem__`` a subclass defines
(the recorded key is the one the dict holds), through an ``OrderedDict``'s own (which keeps its order); a weak
container through its own methods (which make the weak references). A set item already there is not added again (a
set holds it once either way), nor a class, function or module a list already holds (its module's import, which
the hit may run as the miss did, appended it). ``loading/writes/`` finds the writes on a miss.
"""
from __future__ import annotations

import importlib
import sys
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any, Iterable, NamedTuple


class Place(NamedTuple):
    """Where a container lives: ``kind`` is ``"globals"`` (a module's own), ``"dict"``, ``"set"``, ``"list"``,
    ``"weakkeys"``, ``"weakvalues"``, ``"weakset"`` (a module-level object of that kind, ``name`` its global) or
    ``"class"`` (the attributes of the class ``name``, a qualname in ``module``)."""

    kind: str
    module: str
    name: str = ""

    def __reduce__(self) -> tuple:  # explicit: the entry's picklers reduce a tuple subclass as a plain tuple
        return Place, (self.kind, self.module, self.name)

    def describe(self) -> str:
        if self.kind == "globals":
            return f"the globals of {self.module}"
        if self.kind == "class":
            return f"the class attributes of {self.module}.{self.name}"
        return f"{self.module}.{self.name}"

    def find(self) -> Any:
        """The container here (another process: after the result's rebuild imported its modules)."""
        module = sys.modules.get(self.module)
        if module is None:
            module = __import__(self.module, fromlist=["_"])
        if self.kind == "globals":
            return module
        obj: Any = module
        for part in self.name.split("."):
            obj = getattr(obj, part)
        return obj


class Held:
    """A container inside an object the call was given (``entries/arguments_ref.py`` pickles ``target`` as where
    the caller passed it): ``kind`` is ``"attrs"`` (the object's own ``__dict__``, written directly as the loader's
    ``Module.__setattr__`` left it), ``"dict"`` or ``"set"`` (the dict or set the object holds as attribute
    ``name``: a module's ``_modules``, ``_parameters``, hooks) or ``"requires_grad"`` (a tensor's flag)."""

    module = ""  # no module of its own: the writes of a call's arguments name no module's globals

    def __init__(self, kind: str, target: Any, name: str = "") -> None:
        self.kind, self.target, self.name = kind, target, name

    def __reduce__(self) -> tuple:
        return Held, (self.kind, self.target, self.name)

    def describe(self) -> str:
        what = f"{type(self.target).__qualname__} argument's part"
        return f"{self.name} of a {what}" if self.name else f"a {what}"

    def find(self) -> Any:
        if self.kind in ("dict", "set"):
            return self.target.__dict__[self.name]
        return self.target


class DELETED:
    """A write's value where the loader deleted the global or attribute (a class: pickled by name, so it is itself
    after a rebuild)."""


class ABSENT:
    """What a container held at a write's key before it, where it held nothing."""


class Named:
    """A value found at ``getattr(owner, attribute)``, ``owner`` a class (pickled by name) or a module (kept as its
    name); rebuilt as that lookup."""

    def __init__(self, owner: Any, attribute: str) -> None:
        self.owner, self.attribute = owner, attribute

    def __reduce__(self) -> tuple:
        if isinstance(self.owner, ModuleType):
            return module_global, (self.owner.__name__, self.attribute)
        return getattr, (self.owner, self.attribute)


def module_global(module: str, name: str) -> Any:
    """The global ``name`` of ``module`` (imported if it is not yet)."""
    found = sys.modules.get(module)
    if found is None:
        found = importlib.import_module(module)
    return getattr(found, name)


def held(place: Any) -> bool:
    """Whether a write's ``place`` is inside an argument of the call (:class:`Held`)."""
    return isinstance(place, Held)


class Recorded:
    """A result and the writes its loader made, pickled together (the entry's skeleton holds one of these)."""

    def __init__(self, result: Any, writes: list[tuple]) -> None:
        self.result, self.writes = result, writes

    def __reduce__(self) -> tuple:
        return Recorded, (self.result, self.writes)


# A class, function or module appended to a list is appended again only if the list does not hold it yet: the
# import of the module that defines it, which a hit's rebuild may run as the miss's loader ran it, appends it itself.
_NAMED = (type, FunctionType, BuiltinFunctionType, ModuleType)


def stored(kind: type, method: str) -> Any:
    """The compiled ``method`` nearest along ``kind``'s MRO: below a subclass's own Python ``__setitem__`` (which may
    store something else than its argument, as transformers' registry does), but an ``OrderedDict``'s own, which
    keeps its order."""
    for klass in kind.__mro__:
        found = klass.__dict__.get(method)
        if found is not None and not isinstance(found, FunctionType):
            return found
    return getattr(dict, method)


def apply(writes: Iterable[tuple]) -> None:
    """Make each write, in order, as the plain call made it."""
    for place, key, value in writes:
        container = place.find()
        kind = place.kind
        if kind == "attrs":
            if value is DELETED:
                container.__dict__.pop(key, None)
            else:
                container.__dict__[key] = value
        elif kind == "requires_grad":
            container.requires_grad_(value)
        elif kind == "dict" and value is DELETED:
            stored(type(container), "__delitem__")(container, key)
        elif kind in ("globals", "class"):
            if value is DELETED:
                if hasattr(container, key):
                    delattr(container, key)
            else:
                setattr(container, key, value)
        elif kind == "dict":
            stored(type(container), "__setitem__")(container, key, value)
        elif kind in ("weakkeys", "weakvalues"):
            container[key] = value
        elif kind in ("set", "weakset"):
            if value not in container:
                container.add(value)
        elif kind == "list":
            if not (isinstance(value, _NAMED) and any(item is value for item in container)):
                list.append(container, value)
