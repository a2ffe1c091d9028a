"""Classes that cannot be imported by name (defined in a function, made at run time) keep their identity: pickled
with their name and code digest, rebuilt as the live class of that identity where the process has one.

A class defined in a function body (``def make(): class CustomBert(BertModel): ...``) or made at run time by the
user's code is not reachable as ``module.qualname``; pickling can only carry it by value (dill), and rebuilding
makes a new class object: ``type(model) is CustomBert`` would be False where the plain call gives True.

Such a class is pickled as :func:`live_class` of its module, qualified name, code identity (a digest of what the
key describes of it: :meth:`overmind.keys.canon.Walk.type_id`) and its by-value pickle. On rebuild, the class is the
live one with that name and identity if this process has one (:func:`remember` notes the classes a key describes
by their code: the loader's owner class, the classes among its arguments); otherwise, in a process where the
class does not exist, it is what dill rebuilds from the by-value pickle. Classes of installed distributions are
left to the pickler: a library's run-time classes are its own business.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import weakref
from typing import Any, Iterable

from .._util import interrupts

KEEP = 256  # classes remembered at most (the newest): a loader defined in a loop makes a class per call

_live: list[weakref.ref] = []
_lock = threading.Lock()
_by_reference: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def remember(classes: Iterable[type]) -> None:
    """Note ``classes`` (described by their code in a key) as this process's live classes, newest last."""
    with _lock:
        for cls in classes:
            for i, ref in enumerate(_live):
                if ref() is cls:
                    del _live[i]
                    break
            try:
                _live.append(weakref.ref(cls))
            except TypeError:
                continue
        del _live[:-KEEP]


def importable(cls: type) -> bool:
    """Whether ``cls`` is what ``import cls.__module__`` then ``cls.__qualname__`` reaches."""
    obj: Any = sys.modules.get(getattr(cls, "__module__", None) or "")
    qualname = getattr(cls, "__qualname__", "")
    if obj is None or "<locals>" in qualname:
        return False
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return obj is cls


def _by_value(cls: type) -> bool:
    """Whether ``cls`` is a class of the user's code that the pickler could only carry by value."""
    known = _by_reference.get(cls)
    if known is None:
        from .code_identity import distribution_of

        module = getattr(cls, "__module__", None) or ""
        known = module == "builtins" or distribution_of(module) is not None or importable(cls)
        _by_reference[cls] = known
    return not known


def identity(cls: type) -> str:
    """A digest of ``cls`` as a key describes it: its name, bases, methods' code and class attributes."""
    from .canon import Walk

    return hashlib.sha256(repr(Walk().type_id(cls, 0)).encode("utf-8", "surrogatepass")).hexdigest()


def reduce_class(cls: type) -> Any:
    """The reduce of a class of the user's code that is not importable by name; ``NotImplemented`` otherwise."""
    if not isinstance(cls, type) or not _by_value(cls):
        return NotImplemented
    import dill

    try:
        by_value = dill.dumps(cls, protocol=5)
        ident = identity(cls)
    except Exception as e:  # what the class holds cannot be pickled on its own: the pickler tries it in the graph
        interrupts.raise_users(e)
        return NotImplemented
    return (live_class, (cls.__module__, cls.__qualname__, ident, by_value))


def live_class(module: str, qualname: str, ident: str, by_value: bytes) -> type:
    """The live class of this process with that name and identity, else the class rebuilt from ``by_value``
    (named in entries: keep its module path and signature)."""
    with _lock:
        candidates = [c for c in (ref() for ref in reversed(_live))
                      if c is not None and c.__qualname__ == qualname and c.__module__ == module]
    for cls in candidates:
        try:
            if identity(cls) == ident:
                return cls
        except Exception as e:  # a class the key walk could describe once and no longer can: not this one
            interrupts.raise_users(e)
            continue
    import dill

    return dill.loads(by_value)


def reducers() -> dict[type, Any]:
    return {type: reduce_class}
