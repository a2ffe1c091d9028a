"""Claims (singleflight): which owner loads each key now, which claimed keys another owner asked for
meanwhile, and which keys changed (a claim released, or the key published) since the server last
looked.

An owner is a connection id (counting from 1), or ``process_owner(pid)`` for a process that holds a
claim before it has a connection (the spawner's claim, ``handoff.py``). The store decides when to
claim, publish or release; this holds the answers, so that ``take_changed`` can name the keys whose
parked requests may proceed.

>>> claims.claim("k", owner=1); claims.holder("k")
1
"""
from __future__ import annotations


def process_owner(pid: int) -> int:
    """The claim owner that stands for process ``pid`` until one of its connections adopts the
    claim; connection ids count from 1, so the two never meet."""
    return -pid


class Claims:
    """The claims by key, the keys a second owner wants, the keys changed since
    :meth:`take_changed`."""

    def __init__(self) -> None:
        self._owners: dict[str, int] = {}
        # Keys whose claim another owner asked for while it was held: a first load of one is
        # reused, so published.
        self._wanted: set[str] = set()
        self._changed: set[str] = set()

    def holder(self, key: str) -> int | None:
        """The owner claiming ``key``, or None."""
        return self._owners.get(key)

    def claim(self, key: str, owner: int) -> None:
        self._owners[key] = owner

    def want(self, key: str) -> None:
        """Another owner asked for ``key`` while it was claimed."""
        self._wanted.add(key)

    def wanted(self, key: str) -> bool:
        return key in self._wanted

    def adopt(self, key: str, owner: int, pid: int) -> None:
        """Hand a claim held for process ``pid`` to ``owner``, that process's connection naming
        ``key``."""
        if self._owners.get(key) == process_owner(pid):
            self._owners[key] = owner

    def holds(self, owner: int) -> bool:
        """Whether ``owner`` holds any claim."""
        return owner in self._owners.values()

    def release(self, key: str, owner: int) -> bool:
        """Drop ``owner``'s claim on ``key``; False when ``owner`` does not hold it."""
        if self._owners.get(key) != owner:
            return False
        self.settle(key)
        return True

    def release_all(self, owner: int) -> list[str]:
        """Drop every claim of ``owner``; the keys released."""
        keys = [k for k, o in self._owners.items() if o == owner]
        for k in keys:
            self.settle(k)
        return keys

    def settle(self, key: str) -> None:
        """``key`` is published or its claim released: whoever held it, its waiters wake."""
        self._owners.pop(key, None)
        self._wanted.discard(key)
        self._changed.add(key)

    def take_changed(self) -> set[str]:
        """Keys settled since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def __len__(self) -> int:
        return len(self._owners)
