"""Byte ranges of storages that hold drawn values, or values computed from them: added by a write of drawn values,
cleared by a dense overwrite with others.

A pure bookkeeping structure: the :mod:`.tracker` says which bytes of which storage an operation wrote and from
what; this keeps, per storage, the sorted, disjoint ``[start, stop)`` ranges that may hold a drawn value. A write
of drawn values adds its range; a write of values that owe nothing to a draw clears exactly the range it covered.
A storage is named by a key (its address) and held by a weak reference, which also keeps the address from being
reused while the storage is tracked.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


class Taint:
    """Which bytes of which storages may hold drawn values."""

    def __init__(self) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self._refs: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def add(self, key: int, start: int, stop: int, ref: Callable[[], Any]) -> None:
        """Mark ``[start, stop)`` of storage ``key`` as drawn; ``ref()`` makes the storage's weak reference."""
        if stop <= start:
            return
        if key not in self._ranges:
            self._ranges[key] = []
            self._refs[key] = ref()
        merged: list[tuple[int, int]] = []
        for a, b in self._ranges[key]:
            if b < start or a > stop:
                merged.append((a, b))
            else:
                start, stop = min(a, start), max(b, stop)
        merged.append((start, stop))
        merged.sort()
        self._ranges[key] = merged

    def clear(self, key: int, start: int, stop: int) -> None:
        """Mark ``[start, stop)`` of storage ``key`` as holding no drawn value (overwritten by such values)."""
        ranges = self._ranges.get(key)
        if not ranges or stop <= start:
            return
        kept: list[tuple[int, int]] = []
        for a, b in ranges:
            if b <= start or a >= stop:
                kept.append((a, b))
                continue
            if a < start:
                kept.append((a, start))
            if b > stop:
                kept.append((stop, b))
        if kept:
            self._ranges[key] = kept
        else:
            self.forget(key)

    def forget(self, key: int) -> None:
        """Drop storage ``key`` (a storage made anew, or one whose every drawn byte was overwritten)."""
        self._ranges.pop(key, None)
        self._refs.pop(key, None)

    def overlaps(self, key: int, start: int, stop: int) -> bool:
        """Whether any byte of ``[start, stop)`` of storage ``key`` may hold a drawn value."""
        ranges = self._ranges.get(key)
        if not ranges or stop <= start:
            return False
        return any(a < stop and start < b for a, b in ranges)

    def ranges(self, key: int) -> list[tuple[int, int]]:
        """Storage ``key``'s drawn ranges (empty: none)."""
        return list(self._ranges.get(key, ()))

    def live(self, expired: Callable[[Any], bool]) -> list[int]:
        """The keys of the tracked storages still alive (``expired(ref)`` is False); the dead ones are dropped."""
        for key in [k for k, ref in self._refs.items() if expired(ref)]:
            self.forget(key)
        return list(self._ranges)
