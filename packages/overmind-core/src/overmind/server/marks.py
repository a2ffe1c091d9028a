"""Marks: the keys loaded once in this server's life and not published (key, estimated size, loader, arguments,
when), bounded, oldest dropped first, so that the next load of one publishes.

Admission by reuse: a load is published only once it is known to be reused. The first load of a key runs plain
(no entry written, no memory taken) and leaves a mark here: the key, the size its entry would take, and when. A
later load of a marked key, in any process, publishes; a load that arrives while another holds the key's claim
counts as reuse at once (the holder publishes and the waiter hits: ``Store.first_done``). A mark holds no memory
but its own few hundred bytes; the oldest are dropped past :data:`MAX_MARKS`, and ``overmind evict`` drops them
as it drops entries
(``--all``).

>>> marks.note("ab12...", nbytes=440_000_000, loader="AutoModel.from_pretrained", summary="('m',)")
>>> "ab12..." in marks
True
"""
from __future__ import annotations

import collections
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MARKS = 10_000  # ~2 MB of keys at most; a key loaded once that many keys ago publishes on its next load again


class Mark:
    """One key loaded once and not published: its loader and arguments in words, the entry's estimated size,
    when it was first and last loaded, and how many loads left it (one a cap dropped can come back)."""

    __slots__ = ("key", "nbytes", "loader", "summary", "first", "last", "loads")

    def __init__(self, key: str, nbytes: int, loader: str, summary: str, now: float) -> None:
        self.key, self.nbytes, self.loader, self.summary = key, nbytes, loader, summary
        self.first, self.last, self.loads = now, now, 1

    def listing(self) -> dict[str, Any]:
        return {"key": self.key, "nbytes": self.nbytes, "loader": self.loader, "summary": self.summary,
                "first_load": self.first, "last_load": self.last, "loads": self.loads}


class Marks:
    """The marks by key, oldest use first."""

    def __init__(self, limit: int = MAX_MARKS) -> None:
        self.limit = limit
        self._by_key: collections.OrderedDict[str, Mark] = collections.OrderedDict()

    def note(self, key: str, nbytes: int, loader: str = "", summary: str = "") -> None:
        """Mark ``key`` loaded once more without a publish (its entry would take about ``nbytes``)."""
        now = time.time()
        mark = self._by_key.get(key)
        if mark is None:
            self._by_key[key] = Mark(key, nbytes, loader, summary, now)
            while len(self._by_key) > self.limit:
                self._by_key.popitem(last=False)
            return
        mark.nbytes, mark.last, mark.loads = nbytes, now, mark.loads + 1
        self._by_key.move_to_end(key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def drop(self, key: str) -> bool:
        """Forget ``key``'s mark (its entry was published, or it was evicted by name)."""
        return self._by_key.pop(key, None) is not None

    def clear(self) -> int:
        count = len(self._by_key)
        self._by_key.clear()
        return count

    def listing(self) -> list[dict[str, Any]]:
        """Every mark, most recently loaded last."""
        return [m.listing() for m in self._by_key.values()]
