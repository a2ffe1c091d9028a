"""The load flow: a call's key, then a hit or a miss and its publish (:mod:`.flow`); the scope of one user call; the
global random generators around a miss, and what its loader drew (:mod:`.draws`); the replay of a miss's warnings,
log records and writes on a hit.

:func:`load_memo` is what an adapter asks of a running load (the kit, ``overmind.adapter``, hands it on).
"""
from __future__ import annotations


def load_memo(name: str) -> dict:
    """The memo called ``name`` while a load runs in this process (its nested loads included),
    emptied when the last load returns; outside a load, a new empty dict each time. A reducer keeps
    work there that another reduce in the same load may reuse, after checking itself that it fits:
    the memo decides nothing about keys."""
    from . import scope

    return scope.memo(name)
