""":class:`Frozen`: small frozen record classes (equality, hash and repr by field) for the modules ``activate()``
and the server import at their start, where creating a dataclass costs too much.

A dataclass is costly to create: it compiles its methods from generated source (docs/architecture.md, "Measured
costs"). A :class:`Frozen` subclass names its fields in ``__slots__``, ``_fields`` (shown by ``repr``) and
``_compared`` (equality and hash), sets them in its own ``__init__`` with ``object.__setattr__``, and refuses any
later assignment, as a frozen dataclass does (``dataclasses.fields`` and ``dataclasses.replace`` do not apply: build
a new one).
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Frozen:
    """Equality, hash and repr by the fields in ``_fields``; no attribute set after ``__init__``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _compared: tuple[str, ...] = ()
    _hidden: tuple[str, ...] = ()  # fields repr leaves out (functions, large mappings)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._compared)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields if f not in self._hidden)
        return f"{type(self).__name__}({shown})"
