"""How many bytes of shared memory a result's entry would take, known before it is pickled: its distinct storages,
placed as the writer will place them (one shared with a live mapping takes no room); what the server's admission
(``server/admission.py``) is asked with.

:func:`storages` finds the distinct storages the result holds (a walk of its objects, no pickling);
:func:`total` sums them; :func:`entry_bytes` asks the placer where each would go, as the entry's writer will
(``shm/placer.py``): a storage that lies untouched in an entry this process maps, or in a checkpoint file's pages,
takes no room in the new entry. The pickled skeleton (kilobytes) is left out of both.

>>> found = estimate.storages(model)
>>> estimate.total(found) >= estimate.entry_bytes(found)
True
"""
from __future__ import annotations

import collections

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import torch

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), type)
# The exact types of _ATOMS: a container whose items are all of these (a tokenizer's 49k-entry vocabulary) is passed
# over in one C-level set test, not an isinstance per item.
_ATOM_TYPES = frozenset({str, bytes, bytearray, int, float, complex, bool, type(None), type})
# Containers of these exact types are left out when empty (a module's dozen hook dicts), without walking to them;
# their truth value runs no code of anyone's.
_BUILTIN_CONTAINERS = frozenset({dict, collections.OrderedDict, list, tuple, set, frozenset})
MAX_OBJECTS = 500_000  # a walk that meets more objects gives up (None): the publish's own check still holds
_COLLECTIONS = (list, tuple, set, frozenset)
_TENSOR, _MAPPING, _COLLECTION, _CLASS, _OTHER = range(5)  # how the walk treats an object of a type


def storages(result: Any) -> list[torch.UntypedStorage] | None:
    """The distinct storages of the tensors ``result`` holds (meta ones have no bytes and are left out), or None
    when the walk meets more than :data:`MAX_OBJECTS` objects.

    The walk (:func:`tensors`) follows the values of dicts, the items of lists, tuples and sets, and the
    ``__dict__`` values of any other object (not of classes), and stops at tensors and atoms."""
    found_tensors = tensors(result)
    if found_tensors is None:
        return None
    found: dict[tuple[str, int, int], torch.UntypedStorage] = {}
    for t in found_tensors:
        if t.device.type != "meta":
            s = t.untyped_storage()
            found.setdefault((str(s.device), s.data_ptr(), s.nbytes()), s)
    return list(found.values())


def tensors(result: Any) -> list[torch.Tensor] | None:
    """The tensors ``result`` holds, each once, or None when the walk meets more than :data:`MAX_OBJECTS` objects:
    the compiled walk (``csrc/tensor_walk.cpp``, about twice as fast), or :func:`_python_tensors` without it. Both
    read the same attributes and items; only the order of the list may differ."""
    import torch

    from ..native import zerocopy

    walk = zerocopy.tensor_walk()
    if walk is None:
        return _python_tensors(result)
    return walk(result, torch.Tensor, _ATOMS, _ATOM_TYPES, _BUILTIN_CONTAINERS, _COLLECTIONS, MAX_OBJECTS)


def _python_tensors(result: Any) -> list[torch.Tensor] | None:
    import torch

    found: list[torch.Tensor] = []
    seen: set[int] = set()
    kinds: dict[type, int] = {}
    atom_types, containers = _ATOM_TYPES, _BUILTIN_CONTAINERS
    stack = [result]
    met = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        met += 1
        if met > MAX_OBJECTS:
            return None
        t = type(obj)
        kind = kinds.get(t)
        if kind is None:
            kind = _kind(obj, torch.Tensor)
            if not any("__class__" in vars(b) for b in t.__mro__[:-1]):
                kinds[t] = kind  # a type whose instances all answer isinstance alike (no __class__ of their own)
        if kind == _TENSOR:
            found.append(obj)
            continue
        if kind == _MAPPING:
            children: Any = obj.values()
        elif kind == _COLLECTION:
            children = obj
        elif kind == _CLASS:
            continue
        else:
            children = getattr(obj, "__dict__", None)
            if not isinstance(children, dict):
                continue
            children = children.values()
        if atom_types.issuperset(map(type, children)):
            continue
        # A builtin container is no atom (its __class__ is its type): only its emptiness is asked; any other object
        # is asked isinstance, which a proxy's __class__ answers.
        stack.extend(c for c in children if type(c) not in atom_types and id(c) not in seen
                     and (c if type(c) in containers else not isinstance(c, _ATOMS)))
    return found


def _kind(obj: Any, tensor_type: type) -> int:
    """How :func:`storages` walks ``obj`` (by ``isinstance``); the same for every object of its type unless the type
    gives its instances a ``__class__`` of their own (a proxy), which the walk then asks of each."""
    if isinstance(obj, tensor_type):
        return _TENSOR
    if isinstance(obj, dict):
        return _MAPPING
    if isinstance(obj, _COLLECTIONS):
        return _COLLECTION
    if isinstance(obj, type):
        return _CLASS
    return _OTHER


def total(found: list[torch.UntypedStorage]) -> int:
    """The bytes of ``found`` (:func:`storages`), all of them: an upper bound of the entry's data region."""
    return sum(s.nbytes() for s in found)


def entry_bytes(found: list[torch.UntypedStorage]) -> int:
    """The bytes the entry's data region would take for ``found`` (:func:`storages`): storages already shared (an
    entry's pages, a checkpoint file's) are referenced, not counted."""
    from ..shm.placer import Placer

    placer = Placer()
    for s in found:
        placer.place(s)
    return placer.data_len
