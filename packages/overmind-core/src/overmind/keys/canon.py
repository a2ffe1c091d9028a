"""The canonical form of a value in a cache key: a complete description of it, or :class:`Unkeyable`.

Two values get the same canonical form only if a loader cannot tell them apart:

- atoms by type and exact value (``1``, ``1.0``, ``True``, ``0.0`` and ``-0.0`` are four different values);
- containers by type, contents in their order (a set by its sorted elements), and the identity structure
  of what they hold (``[a, a]`` is not ``[a, copy(a)]``);
- a path (``str``, ``bytes`` or ``os.PathLike`` naming something that exists) by its file fingerprint (inside
  :func:`overmind.keys.portable.portable_mode`, by its files' contents alone, not where it lies);
- a tensor by its class, dtype, shape, stride, offset, device, flags (conjugate, negative, requires_grad),
  ``.grad``, Python attributes and bytes; an earlier load's module or tensor by its entry (see
  :mod:`overmind.keys.provenance`);
- a function by its code (or its distribution's version), defaults, closure cells and the globals it reads,
  the user's functions it calls included, transitively;
- a class by its qualified name and (for the user's code) its methods and class attributes;
- any other object by its class and whole state: ``__dict__``, ``__slots__`` and, for a subclass of a
  builtin container, its contents. An object with state Python cannot see (a C extension's) is unkeyable
  unless an adapter gives a stand-in (hook ``overmind_key_for_value``).

Whatever cannot be described completely raises :class:`Unkeyable`: the call then runs without the cache.
"""
from __future__ import annotations

import collections
import ctypes
import enum
import functools
import hashlib
import os
import pathlib
import re
import struct
import sys
import types
from typing import Any, Callable

from .._util import interrupts
from ..errors import Unkeyable
from . import code_identity, fingerprint, portable_entries, provenance

MAX_DEPTH = 64
MAX_NODES = 200_000
MAX_FUNCTIONS = 2_000
MAX_TENSOR_BYTES = 256 << 20  # all tensors of one key together; larger tensors are not keyed by content

_ATOMS = (type(None), bool, int, str, bytes, type(Ellipsis), type(NotImplemented))
# Builtin bases whose instance state canon reads completely (contents, plus __dict__/__slots__ of a subclass).
_SEEN_THROUGH = (object, dict, collections.OrderedDict, list, tuple, set, frozenset, int, float, complex, str,
                 bytes, bytearray, BaseException)
_SKIP_CLASS_ATTRS = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                               "__annotations__", "__dataclass_fields__", "__dataclass_params__",
                               "__match_args__", "__orig_bases__", "__parameters__", "__slots__",
                               "__abstractmethods__", "_abc_impl", "__firstlineno__", "__static_attributes__",
                               "__slotnames__"})  # copyreg caches __slotnames__ on the class at first copy


def _float_bytes(x: float) -> str:
    return struct.pack("<d", x).hex()


class Walk:
    """One key's walk over its values: memo of objects met (identity structure, cycles), budgets."""

    max_tensor_bytes = MAX_TENSOR_BYTES  # read by canon_torch, which must not import this module back

    def __init__(self, hook: Callable[[Any], Any] | None = None) -> None:
        self.hook = hook
        self.memo: dict[Any, int] = {}  # id(obj), or ("type", id(cls)) for a class met by type_id
        self.keep: list[Any] = []  # memo ids stay valid while the walk lives
        self.storages: dict[tuple, int] = {}
        self.nodes = 0
        self.functions = 0
        self.tensor_bytes = 0
        self.code_classes: list[type] = []  # the classes described by their code (local_classes.remember)

    # --- dispatch --------------------------------------------------------------------------------

    def value(self, v: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise Unkeyable(f"the arguments hold more than {MAX_NODES} values; too many to describe")
        if depth > MAX_DEPTH:
            raise Unkeyable(f"argument nesting deeper than {MAX_DEPTH} levels")
        t = type(v)
        if t is float:
            return ("float", _float_bytes(v))
        if t is complex:
            return ("complex", _float_bytes(v.real), _float_bytes(v.imag))
        if t is str:
            return _str_or_path(v)
        if t is bytes:
            return _bytes_or_path(v)
        if t in _ATOMS:
            return v
        ident = id(v)
        seen = self.memo.get(ident)
        if seen is not None:
            return ("ref", seen)
        self.memo[ident] = len(self.memo)
        self.keep.append(v)
        return self._described(v, t, depth + 1)

    def _described(self, v: Any, t: type, depth: int) -> Any:
        if t in (list, tuple):
            return (t.__name__, tuple(self.value(x, depth) for x in v))
        if t is dict:
            return ("dict", self._items(v, depth))
        if t in (set, frozenset):
            return (t.__name__, self._sorted(v, depth))
        if t is bytearray:
            return ("bytearray", bytes(v).hex())
        if isinstance(v, os.PathLike):
            path = os.fspath(v)
            where = _str_or_path(path) if isinstance(path, str) else _bytes_or_path(path)
            if isinstance(v, pathlib.PurePath):
                # All of a pathlib path's state derives from its string (its slots hold parts like "/", which
                # must not be fingerprinted as folders of their own).
                return ("pathlike", self.type_id(t, depth), where)
            return ("pathlike", self.type_id(t, depth), where, self._state(v, t, depth))
        origin = provenance.origin_of(v)
        if origin is not None:
            if not fingerprint.PORTABLE.get():
                return ("entry", origin)
            shared = portable_entries.portable_of(origin)  # else: described by content
            if shared is not None:
                return ("entry", shared)
        if isinstance(v, type):
            return self.type_id(v, depth)
        special = _builtin_form(self, v, t, depth)
        if special is not None:
            return special
        if isinstance(v, (classmethod, staticmethod)):
            return (t.__name__, self.value(v.__func__, depth))
        if isinstance(v, property):
            return ("property", self.value((v.fget, v.fset, v.fdel), depth))
        if isinstance(v, types.ModuleType):
            return self.module(v, (), depth)
        if isinstance(v, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                          types.MethodWrapperType, functools.partial)) or t.__name__ == "method_descriptor":
            return self.callable(v, depth)
        if t.__module__.split(".")[0] == "torch" or _is_tensor(v):
            from . import canon_torch

            return canon_torch.describe(self, v, depth)
        if self.hook is not None and not isinstance(v, (list, tuple, dict, set, frozenset)):
            stand_in = self.hook(v)
            if stand_in is not None:
                return ("adapter", self.type_id(t, depth), self.value(stand_in, depth))
        if isinstance(v, enum.Enum):
            return ("enum", self.type_id(t, depth), v.name, self.value(v.value, depth))
        if _is_ndarray(v):
            return _ndarray(self, v)
        logging = sys.modules.get("logging")
        if logging is not None and isinstance(v, (logging.Logger, logging.LoggerAdapter)):
            # A logger's handlers hold locks; what it logs does not change the loader's result.
            return ("logger", getattr(v, "name", None) or getattr(getattr(v, "logger", None), "name", None))
        return self.instance(v, t, depth)

    # --- containers and instances -----------------------------------------------------------------

    def _items(self, d: dict, depth: int) -> tuple:
        # Insertion order is kept: a loader iterating the dict sees it.
        return tuple((self.value(k, depth), self.value(x, depth)) for k, x in dict.items(d))

    def _sorted(self, s, depth: int) -> tuple:
        # A set's iteration order follows hashes (randomised per process for strings): sort the forms.
        return tuple(sorted((self.value(x, depth) for x in s), key=repr))

    def instance(self, v: Any, t: type, depth: int) -> Any:
        _require_visible_state(t)
        parts: list[Any] = [self.type_id(t, depth)]
        if isinstance(v, dict):
            parts.append(("items", self._items(v, depth)))
        elif isinstance(v, (list, tuple)):
            parts.append(("items", tuple(self.value(x, depth) for x in v)))
        elif isinstance(v, (set, frozenset)):
            parts.append(("items", self._sorted(v, depth)))
        elif isinstance(v, (int, float, complex, str, bytes, bytearray)):
            base: Any = next(b for b in t.__mro__ if b in (int, float, complex, str, bytes, bytearray))
            parts.append(("value", self.value(base(v), depth)))
        elif isinstance(v, BaseException):
            parts.append(("args", self.value(v.args, depth)))
        parts.append(self._state(v, t, depth))
        return ("object",) + tuple(parts)

    def _state(self, v: Any, t: type, depth: int) -> tuple:
        state: list[Any] = []
        try:  # never through getattr: a class's __getattr__ is user code, and keys must not run it
            d = object.__getattribute__(v, "__dict__")
        except (AttributeError, TypeError):
            d = None
        if d is not None:
            if not isinstance(d, dict):
                raise Unkeyable(f"{_qualname(t)}.__dict__ is a {type(d).__name__}, not a dict")
            # Attributes by name: the order they were set in depends on the code path that built the object
            # (a tokenizer loaded for the first time sets them in another order), not on what it is.
            if all(type(k) is str for k in d):
                d = dict(sorted(d.items()))
            state.append(("dict", self._items(d, depth)))
        for cls in t.__mro__:
            for slot in _slots_of(cls):
                descr = cls.__dict__.get(slot)
                if descr is None or not hasattr(descr, "__get__"):
                    continue
                try:
                    state.append((slot, self.value(descr.__get__(v, t), depth)))
                except AttributeError:
                    state.append((slot, ("unset",)))
        return tuple(state)

    # --- code ----------------------------------------------------------------------------------

    def type_id(self, cls: type, depth: int) -> Any:
        name = _qualname(cls)
        dist = code_identity.distribution_of(getattr(cls, "__module__", "") or "")
        if dist is not None or cls.__module__ == "builtins":
            return ("type", name, dist)
        ident = id(cls)
        seen = self.memo.get(("type", ident))
        if seen is not None:
            return ("type-ref", seen)
        self.memo[("type", ident)] = len(self.memo)
        self.keep.append(cls)
        self.code_classes.append(cls)
        self._count_function(name)
        body = []
        for attr, value in cls.__dict__.items():
            if attr in _SKIP_CLASS_ATTRS:
                continue
            if type(value).__name__ in ("member_descriptor", "getset_descriptor", "wrapper_descriptor"):
                body.append((attr, "descriptor"))
                continue
            body.append((attr, self.value(value, depth)))
        bases = tuple(self.type_id(b, depth) for b in cls.__bases__)
        meta = self.type_id(type(cls), depth) if type(cls) is not type else None
        return ("type", name, "code", bases, meta, tuple(body))

    def module(self, m: types.ModuleType, names: tuple[str, ...], depth: int) -> Any:
        """A module: installed ones by distribution; the user's by the attributes ``names`` a function reads."""
        dist = code_identity.distribution_of(m.__name__)
        if dist is not None:
            return ("module", m.__name__, dist)
        if not names:
            raise Unkeyable(f"module {m.__name__} (the user's code, not an installed distribution) cannot be "
                            f"keyed as a value")
        attrs = tuple((n, self.value(getattr(m, n), depth)) for n in names if n in m.__dict__)
        return ("module", m.__name__, "attrs", attrs)

    def callable(self, f: Any, depth: int) -> Any:
        if isinstance(f, functools.partial):
            return ("partial", self.value(f.func, depth), self.value(f.args, depth),
                    self.value(f.keywords, depth), self._state(f, type(f), depth))
        if isinstance(f, types.MethodType):
            return ("method", self.value(f.__self__, depth), self.value(f.__func__, depth))
        if not isinstance(f, types.FunctionType):
            owner = getattr(f, "__self__", None)
            bound = None if owner is None or isinstance(owner, (types.ModuleType, type)) else self.value(owner, depth)
            module = getattr(f, "__module__", None) or getattr(type(owner), "__module__", "") or ""
            return ("builtin", module, getattr(f, "__qualname__", getattr(f, "__name__", "?")),
                    code_identity.distribution_of(module), bound)
        self._count_function(f.__qualname__)
        module = f.__module__ or ""
        dist = code_identity.distribution_of(module)
        closure = tuple(self.value(_cell(c), depth) for c in (f.__closure__ or ()))
        values = (self.value(f.__defaults__, depth), self.value(f.__kwdefaults__, depth), closure,
                  self.value(dict(f.__dict__), depth) if f.__dict__ else None)
        if dist is not None:
            # Installed code is its version; its module-level state is the library's, not the call's.
            return ("function", module, f.__qualname__, dist, values)
        return ("function", module, f.__qualname__, code_identity.code_digest(f.__code__), values,
                self._globals_read(f, depth))

    def _globals_read(self, f: types.FunctionType, depth: int) -> tuple:
        names = code_identity.global_names(f.__code__)
        g = f.__globals__
        out = []
        for name in names:
            if name not in g:
                continue  # an attribute name, or a builtin (Python's own, keyed with Python's version)
            value = g[name]
            if isinstance(value, types.ModuleType):
                out.append((name, self.module(value, names, depth)))
            else:
                out.append((name, self.value(value, depth)))
        return tuple(out)

    def _count_function(self, name: str) -> None:
        self.functions += 1
        if self.functions > MAX_FUNCTIONS:
            raise Unkeyable(f"the loader reaches more than {MAX_FUNCTIONS} functions and classes of the user's "
                            f"code (at {name}); too many to key")


def _builtin_form(walk: Walk, v: Any, t: type, depth: int) -> Any:
    """Builtin types whose whole state is public: read-only dict views, typing aliases and special forms, compiled
    regular expressions, memoising wrappers (keyed by the function they wrap: a cache does not change results),
    signatures and their parameters."""
    if t is types.MappingProxyType:
        return ("mappingproxy", walk._items(dict(v), depth))
    if t is types.GenericAlias or t is getattr(types, "UnionType", None):
        return (t.__name__, walk.value(getattr(v, "__origin__", None), depth), walk.value(v.__args__, depth))
    if t is re.Pattern:
        return ("re", walk.value(v.pattern, depth), v.flags)
    if t is functools._lru_cache_wrapper:
        return ("lru_cache", walk.value(v.__wrapped__, depth))
    if t is types.SimpleNamespace:
        return ("namespace", walk._items(vars(v), depth))
    inspect = sys.modules.get("inspect")  # none of its objects exist before it is imported
    if inspect is not None:
        # A signature's whole state is its two slots, a parameter's its four, each read through its property
        # (signatures are immutable). A hub loader's decorator keeps one in its closure: described this way it
        # takes a tenth of the generic walk of its slots.
        if t is inspect.Signature:
            return ("signature", tuple(walk.value(p, depth) for p in v.parameters.values()),
                    walk.value(v.return_annotation, depth))
        if t is inspect.Parameter:
            return ("parameter", v.name, v.kind.value, walk.value(v.default, depth), walk.value(v.annotation, depth))
    typing = sys.modules.get("typing")
    if typing is not None and t is getattr(typing, "_SpecialForm", None):
        name = getattr(v, "_name", None)
        if isinstance(name, str) and getattr(typing, name, None) is v:
            # typing's own Self, Any, ClassVar...: its name and the Python that defines it say all of it
            return ("special-form", name, walk.type_id(t, depth))
    return None


_EMPTY = ("empty-cell",)


def _cell(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _slots_of(cls: type) -> tuple[str, ...]:
    slots = cls.__dict__.get("__slots__", ())
    if isinstance(slots, str):
        slots = (slots,)
    out = []
    for s in slots:
        if s in ("__dict__", "__weakref__"):
            continue
        if s.startswith("__") and not s.endswith("__"):
            s = f"_{cls.__name__.lstrip('_')}{s}"
        out.append(s)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _layout_is_visible(t: type) -> bool:
    """Whether every byte of a ``t`` instance is Python-visible state (dict, slots, a known builtin base).

    A C extension type (even one built as a heap type, like pyo3 classes) keeps state canon cannot read; its
    instances are larger than their visible parts account for.
    """
    solid = next((b for b in t.__mro__ if b in _SEEN_THROUGH), None)
    if solid is None:
        return False
    for b in t.__mro__:
        if b is solid:
            break
        if not (b.__flags__ & (1 << 9)):  # Py_TPFLAGS_HEAPTYPE: a C type between t and its builtin base
            return False
    expected = solid.__basicsize__ + sum(len(_slots_of(b)) * ctypes.sizeof(ctypes.c_void_p)
                                         for b in t.__mro__ if b is not solid and b not in _SEEN_THROUGH)
    if t.__dictoffset__ and not solid.__dictoffset__:
        expected += ctypes.sizeof(ctypes.c_void_p)
    if t.__weakrefoffset__ and not solid.__weakrefoffset__:
        expected += ctypes.sizeof(ctypes.c_void_p)
    # Python 3.11 keeps __dict__ and __weakref__ before the object for plain classes ("managed dict").
    return t.__basicsize__ <= expected


def _require_visible_state(t: type) -> None:
    if not _layout_is_visible(t):
        raise Unkeyable(f"argument of type {_qualname(t)} keeps state Python cannot see (a C extension type); "
                        f"no adapter gives it a key")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _ndarray(walk: Walk, a: Any) -> Any:
    if a.dtype.hasobject:
        raise Unkeyable("a numpy array of Python objects cannot be keyed by content")
    walk.tensor_bytes += a.nbytes
    if walk.tensor_bytes > MAX_TENSOR_BYTES:
        raise Unkeyable(f"array arguments of more than {MAX_TENSOR_BYTES >> 20} MiB are too large to key by content")
    data = a.tobytes(order="A")
    return ("ndarray", walk.type_id(type(a), 0), a.dtype.str, a.shape, a.strides, hashlib.sha256(data).hexdigest())


def _str_or_path(s: str) -> Any:
    if s and len(s) < 4096 and "\0" not in s:
        try:
            if os.path.exists(s):
                return _path(s)
        except (OSError, ValueError) as exc:
            interrupts.raise_users(exc)
    return s


def _bytes_or_path(b: bytes) -> Any:
    if b and len(b) < 4096 and b"\0" not in b:
        try:
            if os.path.exists(b):
                if fingerprint.PORTABLE.get():
                    return ("bytes", _path(os.fsdecode(b)))
                return ("bytes", b.hex(), _path(os.fsdecode(b)))
        except (OSError, ValueError) as exc:
            interrupts.raise_users(exc)
    return ("bytes", b.hex())


def _path(path: str) -> Any:
    if fingerprint.PORTABLE.get():  # where the files lie is one node's; what they hold is everyone's
        return ("path", fingerprint.fingerprint(path))
    return ("path", os.path.abspath(path), fingerprint.fingerprint(path))


def canon(value: Any, hook: Callable[[Any], Any] | None = None) -> Any:
    """A deterministic stand-in for ``value`` whose ``repr`` is its key material; raises :class:`Unkeyable`."""
    try:
        return Walk(hook).value(value)
    except RecursionError:
        raise Unkeyable("the argument graph is too deep to describe") from None

