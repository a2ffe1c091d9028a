"""Which entries go to make room: a pure planner over what the store knows of its entries.

The store describes each entry as an :class:`Item` (its bytes, when it was last used, what it
references, whether it is pinned) and asks :func:`plan` for the victims that free ``need`` bytes
under ``limit``; it then removes them. Nothing here touches an fd or the store's state, so the rule
is tested on its own (``tests/server/test_eviction_plan.py``).

The rule every order keeps:

- an item referenced by another item that stays is in use, and a pinned one (the new entry's own
  dependencies) is never chosen;
- a keyless item (an entry out of service, a checkpoint file) is never chosen either: it goes with
  the last item that references it, as the store's removal takes it, and its bytes count as freed
  then;
- victims are chosen one at a time, the least in the :class:`Order` among the items free to go,
  until ``need`` fits; none when it fits already, and no plan (None) when even every item free to
  go would not make room.

The order is a parameter: :data:`LEAST_RECENTLY_USED` by default. Another order is one more
:class:`Order` here, handed to ``Store(order=...)``.

>>> plan([Item("a", 10, last_use=1), Item("b", 10, last_use=2)], need=10, limit=20)
['a']
"""
from __future__ import annotations

import collections
import heapq

TYPE_CHECKING = False  # typing, dataclasses and inspect would cost every server's start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, NamedTuple

    class _Fields(NamedTuple):
        id: str
        nbytes: int
        last_use: int = 0
        created: float = 0.0
        hits: int = 0
        deps: tuple[str, ...] = ()
        pinned: bool = False
        keyless: bool = False
else:
    _Fields = collections.namedtuple(
        "Item", ("id", "nbytes", "last_use", "created", "hits", "deps", "pinned", "keyless"),
        defaults=(0, 0.0, 0, (), False, False))


class Item(_Fields):
    """One entry as the planner sees it. ``last_use``: the store's use counter when it was last
    used (larger is more recent); ``created``: when it was published (seconds); ``hits``: how many
    gets it answered; ``deps``: the ids it references; ``pinned``: no eviction may take it now;
    ``keyless``: kept only while another item references it, never chosen. A named tuple: the
    store makes one per entry each time it asks."""

    __slots__ = ()


class Order:
    """An eviction order: ``key`` ranks the items free to go, least first (ties: the first given);
    ``name`` says why an entry went, in the server's log."""

    __slots__ = ("name", "key")

    def __init__(self, name: str, key: Callable[[Item], Any]) -> None:
        self.name, self.key = name, key

    def __repr__(self) -> str:
        return f"Order({self.name!r})"


LEAST_RECENTLY_USED = Order("least recently used", lambda item: item.last_use)


def plan(items: Iterable[Item], need: int, limit: int,
         order: Order = LEAST_RECENTLY_USED) -> list[str] | None:
    """The ids to evict, in turn, so that ``need`` more bytes fit under ``limit`` beside ``items``;
    ``[]`` when they fit already, None when no eviction can make the room."""
    items = list(items)
    used = sum(item.nbytes for item in items)
    if used + need <= limit:
        return []
    if need > limit:
        return None
    by_id = {item.id: item for item in items}
    referents = _referents(items)
    position = {item.id: i for i, item in enumerate(items)}
    free: list[tuple[Any, int, str]] = []

    def offer(item: Item) -> None:
        if not item.pinned and not item.keyless:
            heapq.heappush(free, (order.key(item), position[item.id], item.id))

    for item in items:
        if not referents[item.id]:
            offer(item)
    gone: set[str] = set()
    freed = 0

    def remove(item: Item) -> None:  # as the store removes it: keyless items below it go along
        nonlocal freed
        gone.add(item.id)
        freed += item.nbytes
        for dep_id in item.deps:
            dep = by_id.get(dep_id)
            if dep is None or dep_id in gone:
                continue
            referents[dep_id].discard(item.id)
            if not referents[dep_id]:
                if dep.keyless and not dep.pinned:
                    remove(dep)
                else:
                    offer(dep)

    victims: list[str] = []
    while used - freed + need > limit:
        if not free:
            return None
        _, _, victim = heapq.heappop(free)
        if victim in gone:
            continue
        victims.append(victim)
        remove(by_id[victim])
    return victims


def held_bytes(items: Iterable[Item]) -> int:
    """Bytes of the items no eviction may take now: pinned, or referenced by another item."""
    items = list(items)
    referenced = {dep for item in items for dep in item.deps}
    return sum(item.nbytes for item in items if item.pinned or item.id in referenced)


def _referents(items: list[Item]) -> dict[str, set[str]]:
    """Each item's id -> the ids of the items that reference it."""
    referents: dict[str, set[str]] = {item.id: set() for item in items}
    for item in items:
        for dep in item.deps:
            if dep in referents:
                referents[dep].add(item.id)
    return referents
