"""A hit: the call's entry rebuilt in this process (or taken from an ``overmind run`` template that
built it ahead), then what the miss's loader did besides returning done again: its warnings and log
records in the plain order, the global random generators left where the plain call leaves them. An
entry that cannot stand for this call (its objects do not fit the entry's arguments, the entry does
not rebuild, this process's logging would have made the loader log otherwise) is stepped aside
from: the plain loader runs.
"""
from __future__ import annotations

import logging
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import fallback
from .._util import interrupts
from ..entries import arguments_ref, codec, prebuilt
from ..keys import key
from . import fleet_share, randomness
from .replay import loader_logs, loader_warnings

if TYPE_CHECKING:
    from ..client.connection import Client, GetResult

log = logging.getLogger("overmind")


def serve(client: Client, loader: key.Loader, ck: key.CacheKey, res: GetResult, args: tuple,
          kwargs: dict, arguments: dict | None, call_frame: FrameType | None, since: float) -> Any:
    """The call's result from the entry that ``res`` (a ``hit``) carries, or the plain loader's
    where the entry cannot stand for this call. ``call_frame``: the cached call's frame, whose
    callers a replayed warning names (``replay/loader_warnings.py``); ``since``: when the call
    began asking the server (the hit's time counts from it)."""
    fn = loader.fn
    assert res.entry is not None  # a hit carries its entry
    meta = res.entry.get("meta") or {}
    try:
        obj, ahead = _rebuild(ck, res, arguments)
        warned = loader_warnings.Replay(meta.get("warnings"), call_frame)
        logged = loader_logs.Replay(meta.get("logs"))
        # after the rebuild: the libraries it imports have set their loggers
        other_logging = logged.differs()
        log.info("hit %s (entry %s, %d bytes%s) in %.3f s", loader.name, ck.key[:12],
                 res.entry.get("nbytes", 0), ", built ahead by the template" if ahead else "",
                 time.perf_counter() - since)
    except arguments_ref.ArgumentMismatch as e:
        # This call's objects do not fit where the entry holds arguments: the entry is sound, the
        # call is not the one it was made for (a key that should have told them apart). Plain call;
        # the entry stays.
        fallback.step_aside(f"overmind: entry {ck.key[:12]} of {loader.name} does not fit this "
                            f"call's arguments ({e}); loaded without the cache. Please report "
                            f"this.", e)
        return fn(*args, **kwargs)
    except Exception as e:
        interrupts.raise_users(e)
        # out of service in the server: the next load republishes it
        with interrupts.suppress(Exception):
            client.mark_bad(ck.key, res.entry["entry_id"])
        # The entry is out of service now (mark_bad): the next load publishes it again, so there is
        # nothing to evict; a fix that names a command must work as written.
        fallback.step_aside(f"overmind: cannot rebuild entry {ck.key[:12]} of {loader.name} "
                            f"({type(e).__name__}: {fallback.brief(e)}); loaded without the cache, "
                            f"and the server no longer serves that entry (the next load publishes "
                            f"it again). If this repeats, run 'overmind doctor' and report it.", e)
        return fn(*args, **kwargs)
    if other_logging is not None:  # the loader would not have logged what the entry holds: plain
        del obj
        log.debug("not serving entry %s of %s: %s", ck.key[:12], loader.name, other_logging)
        return fn(*args, **kwargs)
    if "fleet" in meta:  # its portable key stands for its objects in later portable keys
        fleet_share.note_hit(ck.key, meta)
    after = meta.get(randomness.AFTER)
    if after:  # the generators where the plain call leaves them
        randomness.restore(after)
    # The loader's warnings and log records, as the plain call gives them; outside the fallback: an
    # "error" filter raises here
    warned.issue(between=logged.emit)
    return obj


def _rebuild(ck: key.CacheKey, res: GetResult, arguments: dict | None) -> tuple[Any, bool]:
    """The entry's object, and whether an ``overmind run`` template built it ahead
    (``entries/prebuilt.py``). The fds of ``res`` are closed, or handed to the rebuild."""
    assert res.entry is not None  # a hit carries its entry
    try:
        # the object an 'overmind run' template built ahead, if any
        obj = prebuilt.take(ck.key, res.entry["entry_id"], arguments)
    except BaseException:
        res.close()
        raise
    if obj is not prebuilt.NOTHING:
        res.close()
        return obj, True
    return codec.decode(res.entry, res.fds, arguments), False
