"""Admission by reuse: a load publishes its entry only once the entry is known to be reused. A key's first load in
the server's life returns the plain result and leaves a mark, unless another process waits on it or the publish is
cheap against the loader's time; ``OVERMIND_ADMIT``, ``admit=``, ``overmind.admitting``.

A checkpoint evaluated once, or a model loaded once per experiment, never gets a hit: publishing it would only
cost the caller (the pickle, the memfd written) and the machine (memory held). So the first load of a key in the
server's life runs the loader as plain does, without the load arena, and returns its result; the server keeps a
mark (the key, its entry's estimated size, when: ``server/marks.py``). The next load of the key, in any process,
publishes, and every load after it hits. A load that arrives while the first is running waits on its claim, as
every load of a claimed key does, and counts as reuse at once: the first publishes, the waiter hits, so N
processes started together load plainly once, not N times.

A first load publishes at once where the publish is cheap against what the loader did: when the loader ran for at
least :data:`CHEAP_PUBLISH_SHARE` ``**-1`` times the publish's estimated cost (a quantisation, a trace, a
conversion: building again costs far more than publishing). The estimate is :data:`PUBLISH_FIXED_S` plus the
result's storage bytes at :data:`PUBLISH_BYTES_PER_S`, the rate a publish copies at, measured by
``benchmarks/harness/breakdown.py`` (docs/architecture.md, "Measured costs").

``OVERMIND_ADMIT=first`` (``overmind warm`` runs a program so) and ``overmind.load(..., admit="first")`` publish on
the first load; ``admit="reuse"`` keeps the default for one call whatever the setting says.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

from .._util import interrupts

log = logging.getLogger("overmind")
POLICIES = ("reuse", "first")
PUBLISH_BYTES_PER_S = 2.0e9
PUBLISH_FIXED_S = 0.05
CHEAP_PUBLISH_SHARE = 0.05  # a first load publishes when that adds at most 5% to it
_local = threading.local()


@contextlib.contextmanager
def admitting(policy: str) -> Iterator[None]:
    """Loads in this block, nested ones included, admit their entries by ``policy``: ``first`` publishes on the
    first load, ``reuse`` on the first reuse (the default)."""
    if policy not in POLICIES:
        raise ValueError(f"overmind.load: admit={policy!r} is not a policy; give admit='first' (publish on the first "
                         f"load) or admit='reuse' (publish once reused, the default)")
    before = getattr(_local, "policy", None)
    _local.policy = policy
    try:
        yield
    finally:
        _local.policy = before


def publishes_first() -> bool:
    """Whether a first load publishes at once: the call site's ``admit``, else ``OVERMIND_ADMIT``."""
    policy = getattr(_local, "policy", None)
    if policy is None:
        from .. import settings

        policy = settings.current().admit
    return policy == "first"


def publishes_now(client: Any, name: str, ck: Any, result: Any, loader_s: float) -> bool:
    """Whether the first load of key ``ck`` (its loader ran in ``loader_s``) publishes ``result``: at once where
    that is cheap, or because another process waits on the key. False: the server marked the key and released the
    claim, and the caller returns ``result`` as it is."""
    key, nbytes = ck.key, _storage_bytes(result)
    if loader_s * CHEAP_PUBLISH_SHARE >= PUBLISH_FIXED_S + nbytes / PUBLISH_BYTES_PER_S:
        log.info("first load of %s (entry %s) took %.3f s, far more than publishing its %d bytes costs: published "
                 "at once", name, key[:12], loader_s, nbytes)
        return True
    try:
        reused = client.first_done(key, nbytes, name, ck.summary)
    except Exception as e:  # no answer: nothing is lost, the result is the plain one, and the claim is given back
        interrupts.raise_users(e)
        log.debug("first load of %s (entry %s) not marked: %s", name, key[:12], e)
        with interrupts.suppress(Exception):
            client.release(key)
        return False
    if reused:
        log.info("first load of %s (entry %s): another process asked for it meanwhile, so it is published", name,
                 key[:12])
    else:
        log.info("first load of %s (entry %s) returned as loaded; its next load publishes", name, key[:12])
    return reused


def remember_result(result: Any, key: str, arguments: dict | None) -> None:
    """Key ``result``, the loader's own, by ``key`` when it is an argument of a later load, while its storages all
    lie untouched in the checkpoint files it was loaded from (``keys/provenance.py``); never raises."""
    from ..entries import codec

    try:
        codec.remember_origin(result, key, arguments, in_files=True)
    except Exception as e:
        interrupts.raise_users(e)
        log.debug("the result of %s is keyed by its content: %s", key[:12], e)


def _storage_bytes(result: Any) -> int:
    """The bytes of the storages ``result`` holds (0 where the walk gives up: the mark's size is then unknown)."""
    from ..entries import estimate

    try:
        found = estimate.storages(result)
    except Exception as e:
        interrupts.raise_users(e)
        return 0
    return 0 if found is None else estimate.total(found)
