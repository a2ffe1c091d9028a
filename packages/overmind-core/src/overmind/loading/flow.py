"""``load()`` as a chain of stages: the call's key, the server asked for it, then a hit served (or
the variant of the state the call varies with), a step aside to the plain loader, or a load under
the claim, admitted by reuse and published. The policy that the user's load never breaks.

A hit maps the entry (and the entries it references) copy-on-write and unpickles the skeleton. The
first load of a key in the server's life runs the loader plainly and returns its result, leaving
only a mark in the server (admission by reuse: ``admission_by_reuse.py``, ``server/marks.py``). A
later miss runs the loader here, pickles the result with its storages out of band, writes a sealed
memfd, publishes it, and returns the object rebuilt from that memfd, so this process shares the
weights too and a later load that is given this object (``vae=vae``) references its entry instead
of copying it; a result that would gain nothing by it (a tokenizer, a scheduler, a pipeline of
components loaded by nested loads) is returned as the loader made it.

The stages, in the order a call meets them; this module is the chain, each stage's work is in the
module it names:

- key (:func:`_load`): the call described and hashed; a call that cannot be described runs plain.
- ask (:func:`_ask`): the server's answer to this process's claim on the key: a hit, the claim, or
  neither.
- hit (``serve_hit.py``): the entry rebuilt; the loader's warnings, log records and generator
  states again.
- variant (:func:`_serve_variant`, :func:`_key_to_publish`; ``vary.py``): an entry that says the
  call varies with state outside its key sends the call to the variant of that state, down this
  chain again under the variant's key; a claimed load that varied so is published as that variant,
  with the marker under the call's key.
- step aside (:func:`_say_stepped_aside`, and the ``except`` of each stage): refused by the budget,
  a wait that ran out, no server: the plain loader runs.
- claimed load (:func:`_under_claim`, :func:`_load_claimed`; ``claimed_load.py``): the loader under
  the claim with its recordings, and whether an entry can stand for what it did. The claim is given
  back on any exception, Ctrl-C included.
- first-load admission (:func:`_first_load_marked`; ``admission_by_reuse.py``): mark the key, or
  publish.
- publish (:func:`_publish_result`; ``publish.py``): the budget's admission, the entry written and
  published, the result rebuilt from it.

Whatever goes wrong on Overmind's side, the caller gets the plain loader's result and one
:class:`~overmind.fallback.OvermindWarning` naming the cause and the fix (:mod:`.fallback`).
Exceptions raised by the loader itself propagate unchanged. Turning a result into an entry and back
is ``entries/codec.py``'s job.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from .. import fallback
from .._util import gc_pause, heap_aside, heap_trim, interrupts
from ..adapters import hooks
from ..entries import codec
from ..errors import OvermindError
from ..keys import key
from . import admission_by_reuse, claimed_load, code_deps, fleet_share, publish, scope, serve_hit
from . import vary as vary_mod

if TYPE_CHECKING:
    from types import FrameType

    from ..client.connection import Client, GetResult

log = logging.getLogger("overmind")
_local = threading.local()
# Keys this process loads under the claim the server it started holds for it (claim_by_starting):
# the server grants that claim to any thread of the process, so the process's other threads wait
# here for the first one.
_start_claims: dict[str, threading.Event] = {}
# of those keys, the ones another thread waits on: a first load of one publishes
_start_waited: set[str] = set()
_start_lock = threading.Lock()
# vary.variant_key gave None
_CODE_CHANGED = "a module it depends on changed since this process imported it"
# a nested load waits less: two processes waiting on each other's claims must not hang
NESTED_WAIT_S = 60.0
_NOT_PUBLISHED = object()  # what _publish_result returns where the result gets no entry

admitting = admission_by_reuse.admitting  # ``with flow.admitting("first"):`` (load's ``admit``)


def load(fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    """Return ``fn(*args, **kwargs)``, through the cache when possible. See :func:`overmind.load`."""
    # one user call (its nested loads included) warns once; reducers' memos last as long
    # (loading/scope.py); the heap of the libraries out of the collections inside the load
    # (_util/heap_aside.py)
    with fallback.user_call(), scope.scope(), heap_aside.set_aside():
        return _load(fn, *args, **kwargs)


def _load(fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    """The key: the call described and hashed (``keys/key.py``), then the cached call."""
    if fallback.disabled():
        return fn(*args, **kwargs)
    try:
        # the key walks the arguments: no collection over the heap meanwhile
        with gc_pause.paused():
            loader = key.describe_loader(fn)
            arguments = key.bind_arguments(loader, args, kwargs)
            extra = hooks.key_parts(loader, arguments)
            cache_key = key.make_key(loader, arguments, extra, _value_hook)
    except key.Unkeyable as e:
        log.debug("not caching %r: %s", fn, e)
        return fn(*args, **kwargs)
    except Exception as e:
        interrupts.raise_users(e)
        name = getattr(fn, "__qualname__", fn)
        fallback.step_aside(f"overmind: could not compute a cache key for {name!r} "
                            f"({type(e).__name__}: {e}); loaded without the cache. Please report "
                            f"this.", e)
        return fn(*args, **kwargs)
    recheck = _Recheck(loader, arguments, extra)
    return _cached_call(loader, cache_key, args, kwargs, recheck, arguments=arguments)


def _cached_call(loader: key.Loader, ck: key.CacheKey, args: tuple, kwargs: dict,
                 recheck: _Recheck | None = None, arguments: dict | None = None,
                 vary: list[str] | None = None) -> Any:
    """Serve ``ck`` (a hit), or run the loader under this process's claim and publish: the chain.
    ``vary``: ``ck`` is a variant of a call that varies with these names (``vary.py``)."""
    fn, stack = loader.fn, _loading_stack()
    # where the loader's warnings count their stacklevel from (replay/loader_warnings.py)
    call_frame = sys._getframe()
    if ck.key in stack:
        return fn(*args, **kwargs)  # the loader calls itself with the same arguments: no claim
    try:
        asked = _ask(ck, nested=bool(stack))
    except OvermindError as e:
        fallback.server_unavailable(loader.name, e)
        return fn(*args, **kwargs)
    res = asked.res
    if res.status == "hit":
        names = _varies_with(res) if vary is None else None
        if names is not None:
            return _serve_variant(loader, ck, res, names, args, kwargs, recheck, arguments)
        return serve_hit.serve(asked.client, loader, ck, res, args, kwargs, arguments, call_frame,
                               asked.since)
    if res.status != "claimed":
        _say_stepped_aside(loader, ck, res, asked.wait_s)
        return fn(*args, **kwargs)
    return _under_claim(asked, loader, ck, args, kwargs, recheck, arguments, stack, call_frame,
                        vary)


class _Asked(NamedTuple):
    """The server's answer to a call's claim on its key."""

    client: Client
    res: GetResult
    started: bool  # this process started the server, which holds the claim for it
    wait_s: float  # the longest the call waits on another's claim
    since: float  # perf_counter when the call began asking: a hit's time counts from it


def _ask(ck: key.CacheKey, nested: bool) -> _Asked:
    """The server's answer to this call's claim on ``ck``: a hit (once another's claim on it is
    published, where one is held), the claim, or neither (refused, or the wait ran out). With no
    server yet, the load is a miss, claimed by the server this process starts for it (handoff.py).
    Raises :class:`OvermindError` where there is no server to ask."""
    from ..client.connection import GetResult, get_client

    since = time.perf_counter()
    wait_s = _wait_timeout(nested)
    client = get_client()
    with _start_lock:
        loading_here = _start_claims.get(ck.key)
        started = loading_here is None and client.claim_by_starting(ck.key)
        if started:
            _start_claims[ck.key] = threading.Event()
    if loading_here is not None:  # another thread of this process loads it: its publish is our hit
        _start_waited.add(ck.key)
        loading_here.wait(wait_s)
    if started:
        res = GetResult("claimed")
    else:
        res = client.get(ck.key, claim=True, wait=True, timeout=wait_s)
    return _Asked(client, res, started, wait_s, since)


# --- the fleet: a miss asks the fleet's store first (fleet_share.py) ----------------------------


def _from_fleet(asked: _Asked, loader: key.Loader, ck: key.CacheKey,
                recheck: _Recheck) -> GetResult | None:
    """The fleet's entry for the call, imported under its key (claimed by this call), or None."""
    try:
        return fleet_share.serve_from_fleet(asked.client, loader, ck.key, recheck.arguments,
                                            _value_hook)
    except Exception as e:
        interrupts.raise_users(e)
        fallback.step_aside(f"overmind: could not import {loader.name}'s entry from the fleet "
                            f"({type(e).__name__}: {fallback.brief(e)}); loaded it with its "
                            f"loader.", e)
        return None


# --- variant: an entry that says the call varies with state outside its key (vary.py) -----------


def _varies_with(res: GetResult) -> list[str] | None:
    """The names of the state a hit's entry says the call varies with, where it is a marker."""
    assert res.entry is not None  # a hit carries its entry
    meta = res.entry.get("meta") or {}
    names = meta.get(vary_mod.MARKER)
    return [str(n) for n in names] if isinstance(names, list) else None


def _serve_variant(loader: key.Loader, ck: key.CacheKey, res: GetResult, names: list[str],
                   args: tuple, kwargs: dict, recheck: _Recheck | None,
                   arguments: dict | None) -> Any:
    """A hit on the marker of a call that depends on state outside its key (random generators, the
    user's modules): its result is the variant of that state now, down the chain under its key."""
    res.close()
    variant_key = vary_mod.variant_key(ck.key, names)
    if variant_key is None:
        log.debug("not serving %s: %s", loader.name, _CODE_CHANGED)
        return loader.fn(*args, **kwargs)
    variant = key.CacheKey(variant_key, ck.summary, ck.ambient, ck.described)
    return _cached_call(loader, variant, args, kwargs, recheck, arguments, vary=names)


# --- step aside ---------------------------------------------------------------------------------


def _say_stepped_aside(loader: key.Loader, ck: key.CacheKey, res: GetResult,
                       wait_s: float) -> None:
    """Say why the call gets neither a hit nor the claim; the plain loader runs."""
    if res.status == "refused":  # larger than the whole budget, found by an earlier load: plain
        refused = (res.refusal or {}).get("message", "refused")
        fallback.step_aside(f"overmind: not caching {loader.name}: {refused}; loaded plainly.",
                            publish.BudgetRefused())
        return
    fallback.step_aside(f"overmind: another process is still loading {loader.name} (entry "
                        f"{ck.key[:12]}) after {wait_s:.0f} s; loaded without the cache. Raise "
                        f"OVERMIND_WAIT_TIMEOUT to wait longer.")


# --- claimed load -------------------------------------------------------------------------------


def _under_claim(asked: _Asked, loader: key.Loader, ck: key.CacheKey, args: tuple, kwargs: dict,
                 recheck: _Recheck | None, arguments: dict | None, stack: list,
                 call_frame: FrameType | None, vary: list[str] | None) -> Any:
    """Load under this process's claim on ``ck`` (:func:`_load_claimed`), giving the claim back on
    any exception; then let go the process's other threads that wait on the claim held for it."""
    client, res, started = asked.client, asked.res, asked.started
    try:
        if vary is None and recheck is not None and fleet_share.enabled():
            imported = _from_fleet(asked, loader, ck, recheck)
            if imported is not None:  # a hit on the entry another node built
                return serve_hit.serve(client, loader, ck, imported, args, kwargs, arguments,
                                       call_frame, asked.since)
        room = res.room  # None: this process started the server (it holds nothing yet)
        first = started or res.first  # a server this process started has marked nothing yet
        return _load_claimed(client, loader, ck, args, kwargs, recheck, arguments, stack,
                             call_frame, vary, room,
                             first and not admission_by_reuse.publishes_first()
                             and not fleet_share.enabled())
    except BaseException:
        # The loader raised, or Ctrl-C / a signal handler's exception arrived anywhere while this
        # call held the claim: give it back now, or other processes wait on it until this
        # connection closes.
        _release(client, ck.key)
        raise
    finally:
        if started:
            with _start_lock:
                _start_claims.pop(ck.key).set()
                _start_waited.discard(ck.key)


def _load_claimed(client: Client, loader: key.Loader, ck: key.CacheKey, args: tuple,
                  kwargs: dict, recheck: _Recheck | None, arguments: dict | None, stack: list,
                  call_frame: FrameType | None = None, vary: list[str] | None = None,
                  room: int | None = None, first: bool = False) -> Any:
    """Run the loader under this call's claim (``claimed_load.py``), then publish; exceptions of
    the loader propagate. A loader that drew from the global generators, or depends on the user's
    modules beyond its key, is published as a variant of its call (``vary.py``). ``first``: the
    key's first load, which publishes only where it is reused meanwhile
    (``admission_by_reuse.py``). ``room``: what the entry may take before the server is asked
    whether it admits it."""
    claimed = claimed_load.ClaimedLoad(loader, ck, stack, first)
    try:
        result = claimed.run(args, kwargs, arguments, call_frame)
        unfit = claimed.why_not_cached(result, vary)
        if unfit is not None:  # a hit could not do what this call did: not cached
            _release(client, ck.key)
            unfit.say()
            return result
        target = _key_to_publish(client, claimed, ck, vary)
        if target is None:
            return result
        if first and _first_load_marked(client, claimed, ck, target, result, arguments):
            return result
        rebuilt = _publish_result(client, claimed, ck, target, result, recheck, arguments, room)
        if rebuilt is _NOT_PUBLISHED:
            return result
    finally:
        claimed.release_arena()
    del result  # the plain result's memory goes now, and back to the system below
    if not stack:
        # the plain result's freed heap (~0.4 GiB for a pipeline converted to fp16) back to the
        # system
        heap_trim.trim()
    return rebuilt


def _key_to_publish(client: Client, claimed: claimed_load.ClaimedLoad, ck: key.CacheKey,
                    vary: list[str] | None) -> key.CacheKey | None:
    """The key the result is published under: the call's, or the variant's of the state the call
    varied with (its marker then goes under the call's key). None: no variant's key can say that
    state (the claim is given back)."""
    if not claimed.names or vary is not None:
        return ck
    variant_key = vary_mod.variant_key(ck.key, claimed.names, claimed.generators)
    if variant_key is None:
        _release(client, ck.key)
        log.debug("not caching %s: %s", claimed.loader.name, _CODE_CHANGED)
        return None
    return key.CacheKey(variant_key, ck.summary, ck.ambient, ck.described)


# --- first-load admission (admission_by_reuse.py) -----------------------------------------------


def _first_load_marked(client: Client, claimed: claimed_load.ClaimedLoad, ck: key.CacheKey,
                       target: key.CacheKey, result: Any, arguments: dict | None) -> bool:
    """Whether the key's first load leaves a mark instead of publishing: no other thread of this
    process waits on its claim, and the server found no other process waiting, nor is the publish
    cheap against the loader's time."""
    loader_s = claimed.ended - claimed.began
    if ck.key in _start_waited or \
            admission_by_reuse.publishes_now(client, claimed.loader.name, ck, result, loader_s):
        return False
    # marked: the next load of the key publishes (the server released the claim). A result whose
    # weights are untouched checkpoint pages is keyed as the entry's rebuild will be, when it is
    # passed to a later load.
    admission_by_reuse.remember_result(result, target.key, arguments)
    return True


# --- publish (publish.py) -----------------------------------------------------------------------


def _publish_result(client: Client, claimed: claimed_load.ClaimedLoad, ck: key.CacheKey,
                    target: key.CacheKey, result: Any, recheck: _Recheck | None,
                    arguments: dict | None, room: int | None) -> Any:
    """``result`` published under ``target`` and rebuilt from its entry (or itself, where a rebuild
    gains nothing); :data:`_NOT_PUBLISHED` where it gets no entry (the claim given back, the reason
    said)."""
    loader = claimed.loader
    refusal = publish.admission(client, target, result, room)
    if refusal is not None:  # the entry cannot be admitted: known before anything is written
        _release(client, ck.key)
        fallback.step_aside(f"overmind: not caching {loader.name}: {refusal}; returned the plain "
                            f"result.", publish.BudgetRefused(refusal))
        return _NOT_PUBLISHED
    try:
        extra_meta = dict(claimed.after or {}, **fleet_share.publish_meta(target.key))
        rebuilt = publish.publish(client, loader, target, result, arguments, recheck,
                                  claimed.arena, claimed.warned.records,
                                  claimed.logged.for_entry(), extra_meta or None, claimed.writes)
        if target is not ck:  # the call's key names what its variants vary with
            publish.publish_marker(client, loader, ck, claimed.names)
        names = claimed.names
        log.info("published %s (entry %s%s) in %.3f s", loader.name, ck.key[:12],
                 f", a variant by {', '.join(_short(n) for n in names)}" if names else "",
                 time.perf_counter() - claimed.ended)
    except (publish.KeyChanged, codec.UnexpectedMeta, publish.WritesNotKept) as e:
        # not what the key describes, or not all of what the call did can be kept: not cached
        _release(client, ck.key)
        log.info("not caching %s: %s", loader.name, e)
        return _NOT_PUBLISHED
    except Exception as e:
        interrupts.raise_users(e)
        _release(client, ck.key)
        # one user call, one warning: a nested load may have said it already
        claimed.loader_run.not_cached(loader.name, e)
        return _NOT_PUBLISHED
    return rebuilt


# --- what the stages share ----------------------------------------------------------------------


class _Recheck:
    """Recomputes a call's key after its loader ran: a file swapped during the load, or an argument
    the loader changed (``vae.half()`` inside it), means the result may not be what the key
    describes."""

    def __init__(self, loader: key.Loader, arguments: dict, extra: list) -> None:
        self.loader, self.arguments, self.extra = loader, arguments, extra

    def changes(self, ck: key.CacheKey) -> str | None:
        """What the loader changed of what ``ck`` describes, in words; None where the key is still
        ``ck``'s."""
        try:
            now = key.make_key(self.loader, self.arguments, self.extra, _value_hook)
        except key.Unkeyable as e:
            return f"its arguments, which can no longer be described ({e})"
        return None if now.key == vary_mod.base_key(ck.key) else key.what_changed(ck, now)


def _value_hook(value: Any) -> Any:
    return hooks.key_for_value(value)


def _loading_stack() -> list[str]:
    """The keys this thread is loading, outermost first."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _wait_timeout(nested: bool) -> float:
    # A bad OVERMIND_WAIT_TIMEOUT warns once (overmind.settings) and reads as the default.
    from ..client.timeouts import wait_timeout

    total = wait_timeout()
    return min(total, NESTED_WAIT_S) if nested else total


def _release(client: Client, cache_key: str) -> None:
    """Give the claim on ``cache_key`` back (where the server is gone, it went with the
    connection)."""
    try:
        client.release(cache_key)
    except Exception as e:  # the server is gone: the claim went with the connection
        interrupts.raise_users(e)
        log.debug("release of %s failed: %s", cache_key[:12], e)


def _short(name: str) -> str:
    """A vary name for a log line: a generator's name, a module's file name."""
    if name.startswith(code_deps.PREFIX):
        return os.path.basename(name)
    return f"the random generator {name}"
