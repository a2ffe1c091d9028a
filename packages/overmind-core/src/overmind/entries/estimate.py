"""How many bytes of shared memory a result's entry would take, known before it is pickled: what the server's
admission (``server/admission.py``) is asked with.

:func:`storages` finds the distinct storages the result holds (a walk of its objects, no pickling);
:func:`total` sums them; :func:`entry_bytes` asks the placer where each would go, as the entry's writer will
(``shm/placer.py``): a storage that lies untouched in an entry this process maps, or in a checkpoint file's pages,
takes no room in the new entry. The pickled skeleton (kilobytes) is left out of both.

>>> found = estimate.storages(model)
>>> estimate.total(found) >= estimate.entry_bytes(found)
True
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import torch

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), type)
MAX_OBJECTS = 500_000  # a walk that meets more objects gives up (None): the publish's own check still holds


def storages(result: Any) -> list[torch.UntypedStorage] | None:
    """The distinct storages of the tensors ``result`` holds (meta ones have no bytes and are left out), or None
    when the walk meets more than :data:`MAX_OBJECTS` objects."""
    import torch

    found: dict[tuple[str, int, int], torch.UntypedStorage] = {}
    seen: set[int] = set()
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
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                s = obj.untyped_storage()
                found.setdefault((str(s.device), s.data_ptr(), s.nbytes()), s)
            continue
        if isinstance(obj, dict):
            children: Any = obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = obj
        else:
            children = getattr(obj, "__dict__", None)
            children = children.values() if isinstance(children, dict) and not isinstance(obj, type) else ()
        stack.extend(c for c in children if not isinstance(c, _ATOMS) and id(c) not in seen)
    return list(found.values())


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
