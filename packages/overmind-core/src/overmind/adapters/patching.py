"""Patch records: route a library's loader through a cache's load function and put the exact original back.
Mechanism only: apply and restore, symmetric and idempotent, and the registry of originals (``get_original``,
``is_patched``); it tells ``_util/user_frame.py`` which packages hold patched loaders.

This is mechanism only: the caller hands :func:`apply` the *route*, the function a patched loader calls
instead (``activate()`` passes ``overmind.loading.flow.load``), so nothing here knows the load path. One registry
holds every original (as gevent.monkey does): :func:`get_original` and :func:`is_patched` answer from it,
:func:`apply` is idempotent and :func:`restore` undoes exactly what :func:`apply` did, including deleting an
attribute that was only inherited before patching.

>>> from overmind.adapters.patching import PatchTarget, apply, restore
>>> t = PatchTarget(MyModel, "from_pretrained", kind="classmethod", adapter="mylib")
>>> apply(t, overmind.load); ...; restore(t)
"""
from __future__ import annotations

import functools
import threading
import types

from .._util import user_frame
from .._util.frozen import Frozen
from ..errors import OvermindError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    Route = Callable[..., Any]  # route(loader, *args, **kwargs): what a patched loader calls instead

__all__ = ["PatchTarget", "PatchError", "apply", "patch_now", "restore", "is_patched", "get_original",
           "patched_targets", "routed_classmethods"]

_KINDS = ("classmethod", "function", "staticmethod", "replace")


class PatchError(OvermindError, RuntimeError):
    """A patch target could not be applied; the message names the adapter, the target and the fix."""


class PatchTarget(Frozen):
    """One attribute to route through the cache.

    ``owner`` is a class or module; ``name`` the attribute; ``kind`` one of ``classmethod`` (called on a
    class: the class is part of the cache identity), ``function`` (a module-level function) or
    ``staticmethod``, or ``replace``: a plain behavioural patch that installs ``replacement`` as it is
    (not routed through the cache), for fixes an adapter needs while active. ``adapter`` names the adapter
    for error messages (filled in by ``activate``). Frozen, compared and hashed by every field, as a frozen
    dataclass would be (it is a :class:`~overmind._util.frozen.Frozen`: ``activate()`` imports this module, and creating
    a dataclass costs it a millisecond and an import of :mod:`inspect`).
    """

    owner: Any
    name: str
    kind: str
    adapter: str
    replacement: Any
    __slots__ = _fields = _compared = ("owner", "name", "kind", "adapter", "replacement")

    def __init__(self, owner: Any, name: str, kind: str = "classmethod", adapter: str = "",
                 replacement: Any = None):
        for f, v in zip(self._fields, (owner, name, kind, adapter, replacement)):
            object.__setattr__(self, f, v)

    def describe(self) -> str:
        name = getattr(self.owner, "__qualname__", getattr(self.owner, "__name__", "?"))
        owner = getattr(self.owner, "__module__", "") + "." + name
        if isinstance(self.owner, types.ModuleType):
            owner = self.owner.__name__
        return f"{owner}.{self.name}"


class _Record:
    __slots__ = ("target", "original", "had_own")

    def __init__(self, target: PatchTarget, original: Any, had_own: bool):
        self.target = target
        self.original = original  # the object found in owner.__dict__ (or inherited) before patching
        self.had_own = had_own  # whether owner.__dict__ held the attribute itself


_lock = threading.RLock()
_records: dict[tuple[int, str], _Record] = {}


def _slot(owner: Any, name: str) -> tuple[int, str]:
    return (id(owner), name)


def is_patched(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` is currently routed through Overmind."""
    return _slot(owner, name) in _records


def get_original(owner: Any, name: str) -> Any:
    """The object ``owner.name`` held before patching (or the current one if it is not patched)."""
    rec = _records.get(_slot(owner, name))
    if rec is not None:
        return rec.original
    from inspect import getattr_static  # late: activate() imports this module, and inspect costs it ~10 ms

    return getattr_static(owner, name)


def patched_targets() -> list[PatchTarget]:
    """Every target currently patched, in patch order."""
    return [r.target for r in _records.values()]


def routed_classmethods(cls: type) -> list[Any]:
    """The loaders a call ``cls.<name>(...)`` routes, for each patched classmethod ``cls`` reaches: the original
    bound to ``cls``, as the route receives it (the nearest definition along ``cls.__mro__`` is the patched one)."""
    found = []
    with _lock:
        records = list(_records.values())
    for name in dict.fromkeys(r.target.name for r in records if r.target.kind == "classmethod"):
        owner = next((c for c in getattr(cls, "__mro__", ()) if name in vars(c)), None)
        rec = _records.get(_slot(owner, name)) if owner is not None else None
        if rec is not None and rec.target.kind == "classmethod" and isinstance(rec.original, classmethod):
            found.append(rec.original.__get__(None, cls))
    return found


def _make_wrapper(target: PatchTarget, original: Any, route: Route | None) -> Any:
    if target.kind == "replace":
        if target.replacement is None:
            raise PatchError(f"overmind: adapter {target.adapter or '?'}: PatchTarget({target.describe()}, "
                             f"kind='replace') needs a replacement object.")
        return target.replacement
    if route is None:
        raise PatchError(f"overmind: PatchTarget({target.describe()}, kind={target.kind!r}) routes calls: "
                         f"apply() needs the route, e.g. apply(target, overmind.load).")

    if target.kind == "classmethod":
        if not isinstance(original, classmethod):
            raise PatchError(
                f"overmind: adapter {target.adapter or '?'} cannot patch {target.describe()}: expected a classmethod, "
                f"found {type(original).__name__}. The library changed; update the adapter or block it with "
                f"OVERMIND_DISABLED_ADAPTERS={target.adapter or '<name>'}."
            )
        func = original.__func__

        @functools.wraps(func)
        def cached_classmethod(cls, *args, **kwargs):
            return route(original.__get__(None, cls), *args, **kwargs)

        return classmethod(cached_classmethod)

    func = original.__func__ if isinstance(original, staticmethod) else original
    if not callable(func):
        raise PatchError(
            f"overmind: adapter {target.adapter or '?'} cannot patch {target.describe()}: it is not callable "
            f"({type(original).__name__}). Update the adapter."
        )

    @functools.wraps(func)
    def cached_function(*args, **kwargs):
        return route(func, *args, **kwargs)

    return staticmethod(cached_function) if target.kind == "staticmethod" else cached_function


def apply(target: PatchTarget, route: Route | None = None) -> bool:
    """Patch ``target`` so that a call goes to ``route(original_loader, *args, **kwargs)`` (a ``replace``
    target installs its replacement and takes no route); returns False if it was already patched (idempotent).
    """
    if target.kind not in _KINDS:
        raise PatchError(f"overmind: adapter {target.adapter or '?'}: unknown patch kind {target.kind!r} for "
                         f"{target.describe()}; use one of {', '.join(_KINDS)}.")
    with _lock:
        slot = _slot(target.owner, target.name)
        if slot in _records:
            return False
        own = vars(target.owner)
        had_own = target.name in own
        try:
            original = own[target.name] if had_own else get_original(target.owner, target.name)
        except AttributeError:
            raise PatchError(
                f"overmind: adapter {target.adapter or '?'} cannot patch {target.describe()}: no such attribute. "
                f"The library moved it; update the adapter or block it with OVERMIND_DISABLED_ADAPTERS."
            ) from None
        setattr(target.owner, target.name, _make_wrapper(target, original, route))
        _records[slot] = _Record(target, original, had_own)
        user_frame.count_patched(target.owner, 1)
        return True


def patch_now(target: PatchTarget) -> bool:
    """Install ``target``, a ``kind="replace"`` patch, at once: for a replacement an adapter decides
    on while it runs (a conversion it takes over the first time it is met) rather than one it lists in
    ``overmind_patch_targets``. The original is kept in the one registry (:func:`get_original`);
    returns False where ``target`` is patched already."""
    return apply(target)


def restore(target: PatchTarget) -> bool:
    """Undo :func:`apply` exactly; returns False if ``target`` was not patched."""
    with _lock:
        rec = _records.pop(_slot(target.owner, target.name), None)
        if rec is None:
            return False
        if rec.had_own:
            setattr(target.owner, target.name, rec.original)
        else:
            delattr(target.owner, target.name)
        user_frame.count_patched(target.owner, -1)
        return True
