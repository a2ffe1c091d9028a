"""Whether an entry of a given size can be admitted under the budget, asked before the publisher pickles and
writes it, and the keys refused because their entry is larger than the whole budget.

A refusal of that kind holds for every process while the budget stays what it was: the server remembers it by
key, with the budget it was refused under, and answers a later ``get`` of that key ``refused`` (no claim): the
process runs the loader plainly, at plain speed, without a load arena, pickling or writing, with one warning.
An entry that does not fit only because other entries are in use (referenced by others) is refused for now and
not remembered: a later load may find the room.

>>> store.admit(key, need=3 << 30)      # {'admitted': False, 'why': 'budget', 'need': ..., 'budget': ...}
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Refusals:
    """Keys whose entry is larger than the whole budget, with the entry's size and the budget refused under."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[int, int]] = {}

    def remember(self, key: str, need: int, budget: int) -> None:
        self._by_key[key] = (need, budget)

    def under(self, key: str, budget: int) -> dict[str, Any] | None:
        """The refusal of ``key`` if it was refused under this very ``budget`` (another budget forgets it)."""
        found = self._by_key.get(key)
        if found is None:
            return None
        if found[1] != budget:
            del self._by_key[key]
            return None
        return verdict("budget", found[0], budget, budget)

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def __len__(self) -> int:
        return len(self._by_key)


def verdict(why: str, need: int, budget: int, can_free: int) -> dict[str, Any]:
    """A refusal as the wire carries it: why (``budget``: larger than the whole budget; ``in use``: the room
    cannot be freed now), the sizes, and the message the client shows."""
    return {"admitted": False, "why": why, "need": need, "budget": budget, "can_free": can_free,
            "message": message(why, need, budget, can_free)}


def message(why: str, need: int, budget: int, can_free: int) -> str:
    """What the user reads, with the advice that fits the case."""
    from .._util.humanize import human_bytes  # late: its typing import would cost every server's start

    if why == "budget":
        return (f"its entry needs {human_bytes(need)} and the whole budget is {human_bytes(budget)}: the server "
                f"remembers this key, and every process loads it plainly until the budget changes. To cache it, "
                f"set OVERMIND_MAX_BYTES above {human_bytes(need)} and restart the server ('overmind stop')")
    return (f"its entry needs {human_bytes(need)} and only {human_bytes(can_free)} of the {human_bytes(budget)} "
            f"budget can be freed now (the rest holds entries that others reference). Free space ('overmind ls "
            f"--sort size' lists the largest, 'overmind evict PREFIX' drops one) or raise OVERMIND_MAX_BYTES")
