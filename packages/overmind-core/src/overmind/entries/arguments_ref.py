"""Objects a cached call was given, referenced by where they were passed instead of being pickled.

Plain ``Pipeline.from_pretrained(path, vae=vae, controlnet=[edge, depth])`` returns a pipeline whose
``vae`` *is* the caller's ``vae``. To keep that, the pickler asks an :class:`ArgumentIndex` for every
object it meets: an object passed to the call (a top-level argument value, or an element of a list,
tuple or dict argument, recursively through containers only) is written as its path, e.g.
``("controlnet", 0)``, and :func:`resolve` puts the current caller's object back there. Its bytes are
not in the entry at all: the caller already holds them.

This is sound because the cache key covers these arguments (by content, or as an earlier entry's object),
so a hit's caller passes equivalent objects at the same paths; :func:`resolve` still checks the type, and
that objects passed twice (``controlnet=[a, a]``) are again one object, and refuses otherwise.

A call that changes a module it was given (PEFT's ``PeftModel.from_pretrained(base, lora)`` puts LoRA layers into
``base``) keeps those changes as writes to the module's parts (``entries/writes.py``), and its index reaches into the
modules (``into_modules``): a submodule, parameter or buffer of a module argument is a step of its path
(``("model", ".m:encoder", ".m:layer", ".m:0", ".p:weight")``), resolved in the caller's module as the call found it.

Atoms (``None``, numbers, strings, bytes, torch dtypes and devices, classes, enum members, paths,
tuples of atoms) are never substituted: they are interned or shared singletons, so a result holding an
equal one says nothing about where it came from, and a key may call two different ones equal
(``dtype`` folded from ``torch_dtype``, a path given as ``str`` or ``Path``).
"""
from __future__ import annotations

import enum
import pathlib
import pickle
import types
from typing import Any, Iterable, Mapping

import torch

from ..errors import OvermindError

MAX_DEPTH = 8  # container nesting searched below an argument
MAX_OBJECTS = 10_000  # objects indexed per call: beyond this, later ones are pickled as before (copies)

_ATOM_TYPES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented),
               type, types.BuiltinFunctionType, enum.Enum, pathlib.PurePath, range, slice,
               torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
_KEY_TYPES = (str, int)  # dict keys a path can name (JSON-safe, for the entry's metadata)

Path = tuple  # ("vae",) or ("controlnet", 0): the argument's name, then indexes and keys


class ArgumentMismatch(OvermindError, pickle.UnpicklingError):
    """The entry refers to an argument that this call does not pass in the same shape (the key let it through)."""


def is_atom(value: Any) -> bool:
    """Whether ``value``'s identity carries no meaning (substituting it could only confuse equal atoms)."""
    if isinstance(value, _ATOM_TYPES):
        return True
    if type(value) in (tuple, frozenset):
        return all(is_atom(v) for v in value)
    return False


def type_name(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__}"


class ArgumentIndex:
    """Every non-atomic object reachable from bound ``arguments`` through containers, by its first path.

    ``ArgumentIndex({"vae": vae, "controlnet": [edge, depth]}).path_of(edge) == ("controlnet", 0)``.
    The pickler calls :meth:`reference` for each object; it records which paths the entry uses.
    """

    def __init__(self, arguments: dict[str, Any] | None, into_modules: bool = False):
        self.ids: dict[int, Path] = {}  # id() of each indexed object -> its first path
        self._objects: list[Any] = []  # keeps what the ids name alive while the index lives
        self._aliases: dict[Path, list[Path]] = {}  # first path -> every path holding that same object
        self.used: set[Path] = set()
        self._into_modules = into_modules
        if arguments:
            self._scan(arguments)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def _scan(self, arguments: dict[str, Any]) -> None:
        todo: list[tuple[Path, Any, int]] = [((name,), value, 0) for name, value in reversed(arguments.items())]
        while todo and len(self._objects) < MAX_OBJECTS:
            path, value, depth = todo.pop()
            if is_atom(value):
                continue
            first = self.ids.get(id(value))
            if first is not None:
                self._aliases.setdefault(first, [first]).append(path)
                continue  # its contents were indexed under its first path
            self.ids[id(value)] = path
            self._objects.append(value)
            if self._into_modules and isinstance(value, torch.nn.Module):
                todo.extend((path + (step,), child, depth) for step, child in reversed(_module_parts(value)))
                continue
            if depth >= MAX_DEPTH:
                continue
            children = _children(value)
            todo.extend((path + (step,), child, depth + 1) for step, child in reversed(children))

    def path_of(self, obj: Any) -> Path | None:
        return self.ids.get(id(obj))

    def reference(self, obj: Any) -> tuple | None:
        """The persistent id for ``obj`` if it was passed to the call, else None."""
        path = self.ids.get(id(obj))
        if path is None:
            return None
        self.used.add(path)
        return ("arg", path, type_name(obj))

    def alias_groups(self) -> list[list[list]]:
        """For each path the entry uses, the other paths that held the very same object (JSON-ready)."""
        return [[list(p) for p in self._aliases[path]] for path in sorted(self.used, key=repr) if path in self._aliases]


def _children(value: Any) -> list[tuple[Any, Any]]:
    t = type(value)
    if t is list or t is tuple:
        return list(enumerate(value))
    if t is dict:
        return [(k, v) for k, v in value.items() if type(k) in _KEY_TYPES]
    return []  # only plain containers are looked into; any other object is one argument as a whole


_PARTS = {".m:": "_modules", ".p:": "_parameters", ".b:": "_buffers"}


def _module_parts(module: Any) -> list[tuple[str, Any]]:
    """A module's direct submodules, parameters and buffers, each with its path step."""
    return [(prefix + name, part) for prefix, attr in _PARTS.items()
            for name, part in module.__dict__.get(attr, {}).items() if part is not None]


def _step(obj: Any, step: Any) -> Any:
    if type(obj) in (list, tuple, dict):
        return obj[step]
    if isinstance(obj, torch.nn.Module) and isinstance(step, str) and step[:3] in _PARTS:
        part = obj.__dict__[_PARTS[step[:3]]][step[3:]]
        if part is None:
            raise KeyError(step)
        return part
    raise KeyError(step)


def resolve(arguments: Mapping[str, Any] | None, path: Iterable, expected_type: str) -> Any:
    """The current call's object at ``path``; :class:`ArgumentMismatch` if it is absent or of another type."""
    path = tuple(path)
    if not arguments or not path or path[0] not in arguments:
        raise ArgumentMismatch(f"the cached result holds argument {_show(path)}, which this call does not pass")
    obj = arguments[path[0]]
    for step in path[1:]:
        try:
            obj = _step(obj, step)
        except (IndexError, KeyError, TypeError):
            raise ArgumentMismatch(f"the cached result holds argument {_show(path)}, which this call does "
                                   f"not pass") from None
    if type_name(obj) != expected_type:
        raise ArgumentMismatch(f"the cached result holds argument {_show(path)} as a {expected_type}; this call "
                               f"passes a {type_name(obj)} there")
    return obj


class Placeholder:
    """Where a rebuild ahead of the call (an ``overmind run`` template's, ``entries/prebuilt.py``) meets an argument
    it cannot know yet: the call's object at ``path`` goes here once the call is made."""

    __slots__ = ("path", "expected_type")

    def __init__(self, path: Iterable, expected_type: str) -> None:
        self.path, self.expected_type = tuple(path), expected_type

    def resolve(self, arguments: Mapping[str, Any] | None) -> Any:
        """The call's object for this place (:func:`resolve`)."""
        return resolve(arguments, self.path, self.expected_type)


def check_aliases(arguments: Mapping[str, Any] | None, groups: Iterable[Iterable[Iterable]]) -> None:
    """Objects passed at several paths in the publishing call must be one object in this call too (else the
    plain call could hold either, and nothing says which)."""
    for group in groups or ():
        paths = [tuple(p) for p in group]
        first = _at(arguments, paths[0])
        for other in paths[1:]:
            if first is _MISSING or _at(arguments, other) is not first:
                raise ArgumentMismatch(f"the cached result was built from one object passed as both {_show(paths[0])} "
                                       f"and {_show(other)}; this call passes two different objects there")


def _at(arguments: Mapping[str, Any] | None, path: Path) -> Any:
    obj = (arguments or {}).get(path[0], _MISSING)
    for step in path[1:]:
        try:
            obj = _step(obj, step)
        except (IndexError, KeyError, TypeError):
            return _MISSING
    return obj


_MISSING = object()


def _show(path: Path) -> str:
    return path[0] + "".join(f".{step[3:]}" if isinstance(step, str) and step[:3] in _PARTS else f"[{step!r}]"
                             for step in path[1:])
