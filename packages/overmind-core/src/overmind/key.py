"""Cache keys: which loader, called with which arguments, on which files.

- The loader's identity is the class it was called on plus the function (``BertModel.from_pretrained``
  and ``BertForMaskedLM.from_pretrained`` share one inherited function but are different loaders), the
  function's code, and the version of the package that defines it.
- Arguments are bound to the signature with defaults applied: keyword order and an explicit default do not
  change the key.
- A path that exists locally is fingerprinted (size, mtime_ns, inode of every file below it), so an
  overwritten checkpoint is loaded fresh.
- An object returned by an earlier Overmind load is keyed by that entry's key, while its tensors are
  unmodified.
- Anything else raises :class:`Unkeyable`: the caller then loads without the cache.
"""
from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import re
import sys
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

KEY_VERSION = 1
MAX_FINGERPRINT_FILES = 20_000
MAX_TENSOR_KEY_BYTES = 64 << 20


class Unkeyable(Exception):
    """An argument (or the loader) cannot be turned into a stable key; the message says which and why."""


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
    """Identify ``fn``: a function, a classmethod bound to a class, or a ``functools.partial`` of those."""
    if isinstance(fn, functools.partial):
        inner = describe_loader(fn.func)
        return Loader(fn, inner.func, inner.owner, f"partial({inner.name})")
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


def _code_digest(code: types.CodeType, h) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


@functools.lru_cache(maxsize=1024)
def _function_identity(func: Callable) -> tuple:
    h = hashlib.sha256()
    code = getattr(func, "__code__", None)
    if code is not None:
        _code_digest(code, h)
    top = (getattr(func, "__module__", None) or "").split(".")[0]
    version = getattr(sys.modules.get(top), "__version__", None)
    return (_qualname(func), h.hexdigest()[:16], top, str(version))


def loader_identity(loader: Loader) -> tuple:
    fn = loader.fn
    if isinstance(fn, functools.partial):
        return ("partial", loader_identity(describe_loader(fn.func)), canon(fn.args), canon(fn.keywords))
    owner = (_qualname(loader.owner),) if loader.owner is not None else ()
    return owner + _function_identity(loader.func)


# --- arguments -------------------------------------------------------------------------------------

_signatures: dict[Callable, inspect.Signature] = {}


def bind_arguments(loader: Loader, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind to the loader's signature with defaults applied; ``**kwargs`` are flattened in."""
    fn = loader.fn
    sig = _signatures.get(fn) if not isinstance(fn, functools.partial) else None
    if sig is None:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            raise Unkeyable(f"cannot read the signature of {loader.name}: {e}") from None
        if not isinstance(fn, functools.partial):
            try:
                _signatures[fn] = sig
            except TypeError:
                pass
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


# --- canonical form of values ------------------------------------------------------------------

_origins_lock = threading.Lock()
_origins: dict[int, tuple[weakref.ref, str, Callable[[Any], bool]]] = {}


def remember_origin(obj: Any, key: str, pristine: Callable[[Any], bool]) -> None:
    """Record that ``obj`` was returned by the load with ``key`` (used when it is passed to another load).

    ``pristine(obj)`` tells later whether the object still holds the entry's bytes.
    """
    try:
        ref = weakref.ref(obj, lambda _r, i=id(obj): _forget(i, _r))
    except TypeError:
        return  # not weak-referenceable: it is keyed by value (or not at all)
    with _origins_lock:
        _origins[id(obj)] = (ref, key, pristine)


def _forget(ident: int, ref) -> None:
    with _origins_lock:
        if ident in _origins and _origins[ident][0] is ref:
            del _origins[ident]


def origin_of(obj: Any) -> str | None:
    with _origins_lock:
        rec = _origins.get(id(obj))
    if rec is None or rec[0]() is not obj:
        return None
    ref, key, pristine = rec
    if not pristine(obj):
        raise Unkeyable(f"{type(obj).__qualname__} from cache entry {key[:12]} was modified in place; "
                        f"its bytes are no longer the entry's")
    return key


def canon(value: Any, hook: Callable[[Any], Any] | None = None, _depth: int = 0) -> Any:
    """A deterministic, hashable-by-repr stand-in for ``value``; raises :class:`Unkeyable`."""
    if _depth > 50:
        raise Unkeyable("argument nesting deeper than 50 levels")
    t = type(value)
    if value is None or t in (bool, int, float, complex, bytes):
        return value
    if t is str:
        return _canon_str(value)
    if isinstance(value, os.PathLike):
        return _canon_path(os.fspath(value))
    if t in (tuple, list):
        return (t.__name__, tuple(canon(v, hook, _depth + 1) for v in value))
    if t is dict or isinstance(value, dict):
        items = [(canon(k, hook, _depth + 1), canon(v, hook, _depth + 1)) for k, v in value.items()]
        return ("dict", tuple(sorted(items, key=repr)))
    if t in (set, frozenset):
        return ("set", tuple(sorted((canon(v, hook, _depth + 1) for v in value), key=repr)))
    # Before the adapters' hook, and also inside their stand-ins: an adapter keys a hand-built container
    # (diffusers' MultiControlNetModel) as the list of its parts, each of them an earlier load's object.
    origin = origin_of(value)
    if origin is not None:
        return ("entry", origin)
    if hook is not None:
        stand_in = hook(value)
        if stand_in is not None:
            return ("adapter", _qualname(t), canon(stand_in, None, _depth + 1))
    mod = t.__module__
    if mod == "torch":
        return _canon_torch(value)
    if _is_tensor(value):
        return _canon_tensor(value)
    if isinstance(value, enum.Enum):
        return ("enum", _qualname(t), value.name)
    if isinstance(value, type):
        return ("type", _qualname(value))
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return ("function",) + _function_identity(value)
    if dataclasses.is_dataclass(value):
        return ("dataclass", _qualname(t),
                tuple((f.name, canon(getattr(value, f.name), hook, _depth + 1)) for f in dataclasses.fields(value)))
    raise Unkeyable(f"argument of type {_qualname(t)} has no stable key (not a plain value, a path, an object "
                    f"from an earlier Overmind load, or a type an adapter keys)")


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _canon_torch(value: Any) -> Any:
    import torch

    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return ("torch", str(value))
    if isinstance(value, torch.Tensor):
        return _canon_tensor(value)
    raise Unkeyable(f"torch argument of type {type(value).__name__} has no stable key")


def _canon_tensor(t: Any) -> Any:
    nbytes = t.numel() * t.element_size()
    if nbytes > MAX_TENSOR_KEY_BYTES or t.device.type == "meta":
        raise Unkeyable(f"tensor argument of {nbytes} bytes on {t.device} is too large to key by content")
    flat = t.detach().to("cpu").contiguous()
    data = ctypes.string_at(flat.data_ptr(), nbytes) if nbytes else b""
    return ("tensor", str(t.dtype), tuple(t.shape), hashlib.sha256(data).hexdigest())


def _canon_str(s: str) -> Any:
    if s and len(s) < 4096 and "\0" not in s:
        try:
            if os.path.exists(s):
                return _canon_path(s)
        except (OSError, ValueError):
            pass
    return s


def _canon_path(path: str) -> Any:
    return ("path", os.path.abspath(path), fingerprint(path))


def fingerprint(path: str) -> tuple:
    """Size, mtime_ns and inode of ``path`` and, for a folder, of every file below it (symlinks followed,
    as in a Hugging Face cache whose snapshot files link to blobs)."""
    st = os.stat(path)
    if not os.path.isdir(path):
        return (st.st_size, st.st_mtime_ns, st.st_ino)
    rows = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                fst = os.stat(full)
            except OSError:
                continue  # a dangling link: not part of what can be loaded
            rows.append((os.path.relpath(full, path), fst.st_size, fst.st_mtime_ns, fst.st_ino))
            if len(rows) > MAX_FINGERPRINT_FILES:
                raise Unkeyable(f"{path} holds more than {MAX_FINGERPRINT_FILES} files; too many to fingerprint")
    return tuple(rows)


# --- the key -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheKey:
    key: str
    summary: str


def make_key(loader: Loader, arguments: dict[str, Any], extra_parts: list[Any] = (),
             value_hook: Callable[[Any], Any] | None = None) -> CacheKey:
    """The cache key of calling ``loader`` with bound ``arguments`` (see :func:`bind_arguments`)."""
    canon_args = tuple(sorted((name, canon(v, value_hook)) for name, v in arguments.items()))
    material = repr((KEY_VERSION, loader_identity(loader), canon_args, canon(list(extra_parts), value_hook)))
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return CacheKey(digest, summarize(loader, arguments))


_SECRET = re.compile(r"token|password|passwd|secret|api_?key|credential", re.IGNORECASE)


def summarize(loader: Loader, arguments: dict[str, Any], limit: int = 160) -> str:
    """A short human-readable line of the arguments, for ``overmind ls``."""
    parts = [f"{name}={'***' if _SECRET.search(name) else repr(value)[:60]}" for name, value in arguments.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"
