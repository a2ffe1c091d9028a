"""Cache keys: which loader (its identity), called with which arguments (bound, canonical), on which files, with the
adapters' key parts; the key digest.

- The loader's identity is the class it was called on plus the function (``BertModel.from_pretrained``
  and ``BertForMaskedLM.from_pretrained`` share one inherited function but are different loaders), described
  like any function value (:mod:`overmind.keys.canon`): installed code by its distribution's version, the user's
  code by its code, closure cells, defaults and the globals it reads.
- Arguments are bound to the signature with defaults applied: keyword order and an explicit default do not
  change the key. All arguments are described in one walk, so an object passed twice is seen as one.
- Values are described completely (:func:`overmind.keys.canon.canon`) or the call is :class:`Unkeyable` and runs
  without the cache. ``docs/architecture.md`` states the contract.
- A key is the digest of its parts, each declared once in :data:`PARTS` (the loader, the
  arguments, the adapters' parts, torch's process state): how it is described, and how a change in
  it is said.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from . import local_classes, torch_state
from .canon import Unkeyable, Walk, canon

# Part of every key: raised whenever what a key describes, or what an entry's skeleton names (the module paths of
# the functions that rebuild it), changes, so that entries an older Overmind published are never looked up.
KEY_VERSION = 8
__all__ = ["Unkeyable", "Loader", "CacheKey", "KeyPart", "PARTS", "describe_loader",
           "bind_arguments", "make_key", "canon", "summarize"]


@dataclass(frozen=True)
class Loader:
    """A loader call's identity. ``fn`` is what gets called; ``owner`` is the class for classmethods."""

    fn: Callable
    func: Callable  # the underlying function (signature, code)
    owner: type | None
    name: str

    @property
    def library(self) -> str:
        return (getattr(self.func, "__module__", None) or "").split(".")[0]


def describe_loader(fn: Callable) -> Loader:
    """Identify ``fn``: a function, a classmethod bound to a class, a class (called to construct the result), or a
    ``functools.partial`` of those."""
    if isinstance(fn, functools.partial):
        inner = describe_loader(fn.func)
        return Loader(fn, inner.func, inner.owner, f"partial({inner.name})")
    if isinstance(fn, type):  # a class: its construction is the load (``overmind.load(SentenceTransformer, path)``)
        return Loader(fn, fn, None, _qualname(fn))
    owner = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", fn)
    if isinstance(owner, type):
        return Loader(fn, func, owner, f"{_qualname(owner)}.{func.__name__}")
    if owner is not None and not isinstance(owner, types.ModuleType):
        raise Unkeyable(f"{fn!r} is a method bound to an instance of {type(owner).__qualname__}; "
                        f"Overmind caches functions and classmethods")
    if not callable(func) or not hasattr(func, "__code__") and not inspect.isbuiltin(func):
        raise Unkeyable(f"{fn!r} is not a function or classmethod")
    return Loader(fn, func, None, _qualname(func))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def loader_identity(loader: Loader, walk: Walk | None = None) -> tuple:
    """The loader as key material: its owner class (for classmethods) and its function, described fully."""
    walk = walk or Walk()
    owner = walk.type_id(loader.owner, 0) if loader.owner is not None else None
    return ("loader", owner, walk.value(loader.fn if isinstance(loader.fn, functools.partial) else loader.func))


# --- arguments -------------------------------------------------------------------------------------

# Signatures by the underlying function, weakly: a loader defined in a loop (a fresh lambda each time) must
# not be kept alive by this cache.
_signatures: weakref.WeakKeyDictionary[Callable, dict[bool, inspect.Signature]] = weakref.WeakKeyDictionary()


def signature_of(loader: Loader) -> inspect.Signature:
    """The loader's signature (remembered per function, weakly)."""
    fn = loader.fn
    bound = loader.owner is not None
    cacheable = not isinstance(fn, functools.partial)
    if cacheable:
        try:
            cached = _signatures.get(loader.func, {}).get(bound)
        except TypeError:
            cacheable, cached = False, None
        if cached is not None:
            return cached
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise Unkeyable(f"cannot read the signature of {loader.name}: {e}") from None
    if cacheable:
        _signatures.setdefault(loader.func, {})[bound] = sig
    return sig


def bind_arguments(loader: Loader, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind to the loader's signature with defaults applied; ``**kwargs`` are flattened in."""
    sig = signature_of(loader)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise Unkeyable(f"arguments do not match {loader.name}{sig}: {e}") from None
    bound.apply_defaults()
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


# --- the key ---------------------------------------------------------------------------------


class Call(NamedTuple):
    """What a key describes: the loader, its bound arguments (:func:`bind_arguments`) and the
    adapters' parts."""

    loader: Loader
    arguments: dict[str, Any]
    extra_parts: list[Any] | tuple[()]


@dataclass(frozen=True)
class KeyPart:
    """One part of every key, declared once in :data:`PARTS`. ``describe`` is its value for a
    call: key material, taken in the call's one walk (an object met in two parts is one object).
    ``said`` is what a loader changed, in words, when two keys of one call differ in this part: a
    phrase, or a function of the two values."""

    name: str
    describe: Callable[[Call, Walk], Any]
    said: str | Callable[[Any, Any], str]

    def change(self, before: Any, after: Any) -> str:
        return self.said if isinstance(self.said, str) else self.said(before, after)


def _arguments(call: Call, walk: Walk) -> tuple:
    """((argument name, canonical form), ...) by name."""
    return tuple((name, walk.value(call.arguments[name])) for name in sorted(call.arguments))


def _arguments_changed(before: tuple, after: tuple) -> str:
    old, new = dict(before), dict(after)
    names = [name for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]
    return f"its argument{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}"


TORCH_STATE = KeyPart("torch state", lambda call, walk: torch_state.key_part(),
                      "torch's process state (default dtype or device, a mode)")

# The parts of every key, in the order they are described and hashed. A new part is one more row
# (and its test); it changes every digest by itself, so no entry of the keys before it is looked up.
PARTS: tuple[KeyPart, ...] = (
    KeyPart("loader", lambda call, walk: loader_identity(call.loader, walk),
            "its own identity (a global value its code reads)"),
    KeyPart("arguments", _arguments, _arguments_changed),
    KeyPart("adapter parts", lambda call, walk: walk.value(list(call.extra_parts)),
            "the files it reads (or another part an adapter keys)"),
    TORCH_STATE,
)
_TORCH_STATE_AT = PARTS.index(TORCH_STATE)


@dataclass(frozen=True)
class CacheKey:
    key: str
    summary: str
    ambient: tuple = torch_state.DEFAULTS  # the process state the key holds (its TORCH_STATE part)
    # what the digest was made of, each of PARTS' values in their order (for what_changed)
    described: tuple = field(default=(), compare=False, repr=False)


def make_key(loader: Loader, arguments: dict[str, Any], extra_parts: list[Any] | tuple[()] = (),
             value_hook: Callable[[Any], Any] | None = None) -> CacheKey:
    """The cache key of calling ``loader`` with bound ``arguments`` (see :func:`bind_arguments`)."""
    walk = Walk(value_hook)
    call = Call(loader, arguments, extra_parts)
    try:
        described = tuple(part.describe(call, walk) for part in PARTS)
    except RecursionError:
        raise Unkeyable("the arguments are nested too deeply to describe") from None
    if walk.code_classes:  # a result holding one of these gets it back by identity (keys/local_classes.py)
        local_classes.remember(walk.code_classes)
    material = repr((KEY_VERSION, *described))
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return CacheKey(digest, summarize(loader, arguments), described[_TORCH_STATE_AT], described)


def what_changed(before: CacheKey, after: CacheKey) -> str:
    """What differs between two keys of one call, in words (each part's ``said``, in
    :data:`PARTS`' order): ``"its argument 'model'"``, ``"the files it reads"``, ``"torch's process
    state"``, its own identity (a global its code reads), for a loader that changed what its key
    describes while it ran."""
    said = [part.change(old, new)
            for part, old, new in zip(PARTS, before.described, after.described) if old != new]
    return " and ".join(said) or "its key"


_SECRET = re.compile(r"token|password|passwd|secret|api_?key|credential", re.IGNORECASE)


def summarize(loader: Loader, arguments: dict[str, Any], limit: int = 320) -> str:
    """A short human-readable line of the arguments, for ``overmind ls``."""
    parts = [f"{name}={'***' if _SECRET.search(name) else _short_repr(value)}" for name, value in arguments.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"


_SHOWN = (str, bytes, int, float, complex, bool, type(None))


def _short_repr(value: Any) -> str:
    """Atoms and flat lists of them as ``repr``; anything else by its class. A user object's ``__repr__`` is
    never called: it may fail, be slow, or change the object (diffusers' ``ConfigMixin.__repr__`` writes
    ``_class_name`` into the config it prints), and the cached call must leave the arguments as they were."""
    if isinstance(value, _SHOWN) or isinstance(value, os.PathLike):
        return _clip(repr(value), 120)  # a path's tail tells entries apart: keep it
    if type(value).__module__ == "torch" and not hasattr(value, "shape"):
        return str(value)[:60]  # torch.float16, device('cpu')
    if isinstance(value, (list, tuple)) and len(value) <= 8 and all(isinstance(v, _SHOWN) for v in value):
        return repr(value)[:60]
    return f"<{type(value).__qualname__}>"


def _clip(text: str, limit: int) -> str:
    """``text`` with its middle cut to fit ``limit`` characters (start and end kept)."""
    return text if len(text) <= limit else text[:limit // 3] + "…" + text[len(text) - (limit - limit // 3 - 1):]
