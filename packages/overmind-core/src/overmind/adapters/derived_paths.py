"""What an adapter's ``overmind_derived_paths`` hook returns: a place in a loader's result that holds a path its
library derived from one of the call's arguments.

Calls that name one folder by different spellings (``m``, ``./m``, ``/abs/m/``) share an entry, and plain keeps
each caller's own spelling there (a model's ``config._name_or_path``). Only the adapter knows which places its
library fills from the argument; the core checks each value against the argument and writes a hit's own spelling
there (:mod:`overmind.entries.path_spellings`).
"""
from __future__ import annotations

from .._util.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable

STEP_KINDS = ("attr", "item")


class DerivedPath(Frozen):
    """The path at ``key`` of what ``steps`` reach from the result, derived from the call's argument ``argument``.

    Each step is ``("attr", name)``, an attribute kept in an object's ``__dict__``, or ``("item", key)``, an item
    of a dict, list or tuple. ``item=False``: ``key`` is an attribute of the object the steps reach; ``item=True``: an
    item of the dict they reach. ``argument`` is the parameter's name in the bound arguments.

    >>> DerivedPath([("attr", "config")], "_name_or_path", "pretrained_model_name_or_path")  # model.config's
    """

    steps: tuple[tuple[str, Any], ...]
    key: Any
    argument: str
    item: bool
    __slots__ = _fields = _compared = ("steps", "key", "argument", "item")

    def __init__(self, steps: Iterable[tuple[str, Any]], key: Any, argument: str, item: bool = False) -> None:
        steps = tuple((kind, at) for kind, at in steps)
        bad = [step for step in steps if step[0] not in STEP_KINDS]
        if bad:
            raise ValueError(f"DerivedPath step {bad[0]!r}: a step is ('attr', name) or ('item', key)")
        for f, v in zip(self._fields, (steps, key, argument, bool(item))):
            object.__setattr__(self, f, v)
