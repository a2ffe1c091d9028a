"""A miss's recording of what its loader writes: :func:`start` before the loader runs, :func:`finish` after it; a
failure reads as writes that cannot be described (the call is not cached).

Recording never breaks the load: a failure to take or compare the state reads as writes that cannot be described,
so the call is not cached (one debug line says why), and the loader's result is returned as plain returns it.
"""
from __future__ import annotations

import logging

from ..._util import gc_pause, interrupts
from . import changes

log = logging.getLogger("overmind")


def start() -> changes.Before | None:
    """The watched state as the loader starts (None: it could not be taken)."""
    try:
        with gc_pause.paused():  # thousands of small copies: no collection over the libraries' heap meanwhile
            return changes.Before()
    except Exception as e:
        interrupts.raise_users(e)
        log.debug("the state a loader may write could not be marked: %s: %s", type(e).__name__, e)
        return None


def finish(before: changes.Before | None) -> changes.Found:
    """What the loader wrote since :func:`start` gave ``before``."""
    if before is None:
        return changes.Found(unreplayable="the state it may write could not be marked before it ran")
    try:
        with gc_pause.paused():
            return changes.since(before)
    except Exception as e:
        interrupts.raise_users(e)
        return changes.Found(unreplayable=f"what it wrote could not be read ({type(e).__name__}: {e})")
