"""``load()``: key -> hit | miss -> publish; the variants of calls that vary with state outside their key; the
policy that the user's load never breaks.

A hit maps the entry (and the entries it references) copy-on-write and unpickles the skeleton. The first load
of a key in the server's life runs the loader plainly and returns its result, leaving only a mark in the server
(admission by reuse: ``admission_by_reuse.py``, ``server/marks.py``). A later miss
runs the loader here, pickles the result with its storages out of band, writes a sealed memfd, publishes
it, and returns the object rebuilt from that memfd, so this process shares the weights too and a later
load that is given this object (``vae=vae``) references its entry instead of copying it; a result that would
gain nothing by it (a tokenizer, a scheduler, a pipeline of components loaded by nested loads) is returned as
the loader made it.

Whatever goes wrong on Overmind's side, the caller gets the plain loader's result and one
:class:`~overmind.fallback.OvermindWarning` naming the cause and the fix (:mod:`.fallback`). Exceptions raised
by the loader itself propagate unchanged. Turning a result into an entry and back is :mod:`.entry`'s job.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

from .. import fallback
from .._util import gc_pause, heap_aside, heap_trim, interrupts
from ..adapters import hooks
from ..entries import arguments_ref, codec, pickling, prebuilt
from ..entries.writes import held
from ..errors import OvermindError, ServerError
from ..keys import key, provenance, torch_state
from ..shm import arena
from . import admission_by_reuse, code_deps, randomness, scope
from . import vary as vary_mod
from .replay import loader_logs, loader_warnings
from .writes import arguments as argument_writes
from .writes import recording as writes_recording
from .writes import replay as writes_replay

log = logging.getLogger("overmind")
_local = threading.local()
# Keys this process loads under the claim the server it started holds for it (claim_by_starting): the server
# grants that claim to any thread of the process, so the process's other threads wait here for the first one.
_start_claims: dict[str, threading.Event] = {}
_start_waited: set[str] = set()  # of those keys, the ones another thread waits on: a first load of one publishes
_start_lock = threading.Lock()
_CODE_CHANGED = "a module it depends on changed since this process imported it"  # vary.variant_key gave None
NESTED_WAIT_S = 60.0  # a nested load waits less: two processes waiting on each other's claims must not hang


def _loading_stack() -> list[str]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


admitting = admission_by_reuse.admitting  # ``with flow.admitting("first"):`` (overmind.load's ``admit``)


def load(fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    """Return ``fn(*args, **kwargs)``, through the cache when possible. See :func:`overmind.load`."""
    # one user call (its nested loads included) warns once; reducers' memos last as long (loading/scope.py)
    # the heap of the libraries out of the collections inside the load (_util/heap_aside.py)
    with fallback.user_call(), scope.scope(), heap_aside.set_aside():
        return _load(fn, *args, **kwargs)


def _load(fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    if fallback.disabled():
        return fn(*args, **kwargs)
    try:
        with gc_pause.paused():  # the key walks the arguments: no collection over the heap meanwhile
            loader = key.describe_loader(fn)
            arguments = key.bind_arguments(loader, args, kwargs)
            extra = hooks.key_parts(loader, arguments)
            cache_key = key.make_key(loader, arguments, extra, _value_hook)
    except key.Unkeyable as e:
        log.debug("not caching %r: %s", fn, e)
        return fn(*args, **kwargs)
    except Exception as e:
        interrupts.raise_users(e)
        fallback.step_aside(f"overmind: could not compute a cache key for {getattr(fn, '__qualname__', fn)!r} "
                            f"({type(e).__name__}: {e}); loaded without the cache. Please report this.", e)
        return fn(*args, **kwargs)
    return _cached_call(loader, cache_key, args, kwargs, _Recheck(loader, arguments, extra), arguments=arguments)


class _Recheck:
    """Recomputes a call's key after its loader ran: a file swapped during the load, or an argument the loader
    changed (``vae.half()`` inside it), means the result may not be what the key describes."""

    def __init__(self, loader: key.Loader, arguments: dict, extra: list) -> None:
        self.loader, self.arguments, self.extra = loader, arguments, extra

    def changes(self, ck: key.CacheKey) -> str | None:
        """What the loader changed of what ``ck`` describes, in words; None where the key is still ``ck``'s."""
        try:
            now = key.make_key(self.loader, self.arguments, self.extra, _value_hook)
        except key.Unkeyable as e:
            return f"its arguments, which can no longer be described ({e})"
        return None if now.key == vary_mod.base_key(ck.key) else key.what_changed(ck, now)


def _value_hook(value: Any) -> Any:
    return hooks.key_for_value(value)


def _wait_timeout(nested: bool) -> float:
    # A bad OVERMIND_WAIT_TIMEOUT warns once (overmind.settings) and reads as the default.
    from ..client.timeouts import wait_timeout

    total = wait_timeout()
    return min(total, NESTED_WAIT_S) if nested else total


def _cached_call(loader: key.Loader, ck: key.CacheKey, args: tuple, kwargs: dict,
                 recheck: _Recheck | None = None, arguments: dict | None = None, vary: list[str] | None = None) -> Any:
    """Serve ``ck`` (a hit), or run the loader under this process's claim and publish. ``vary``: ``ck`` is a variant
    of a call that draws from these generators (loading/randomness.py)."""
    fn, stack = loader.fn, _loading_stack()
    call_frame = sys._getframe()  # where the loader's warnings count their stacklevel from (replay/loader_warnings.py)
    if ck.key in stack:
        return fn(*args, **kwargs)  # the loader calls itself with the same arguments: no claim to wait on
    from ..client.connection import GetResult, get_client

    t0 = time.perf_counter()
    try:
        wait_s = _wait_timeout(nested=bool(stack))
        client = get_client()
        # No server yet: this load is a miss, claimed by the server this process starts for it (handoff.py).
        with _start_lock:
            loading_here = _start_claims.get(ck.key)
            started = loading_here is None and client.claim_by_starting(ck.key)
            if started:
                _start_claims[ck.key] = threading.Event()
        if loading_here is not None:  # another thread of this process loads it: its publish is this call's hit
            _start_waited.add(ck.key)
            loading_here.wait(wait_s)
        res = GetResult("claimed") if started else client.get(ck.key, claim=True, wait=True, timeout=wait_s)
    except OvermindError as e:
        fallback.server_unavailable(loader.name, e)
        return fn(*args, **kwargs)
    if res.status == "hit":
        assert res.entry is not None  # a hit carries its entry
        meta = res.entry.get("meta") or {}
        if vary is None and isinstance(meta.get(vary_mod.MARKER), list):
            # The call depends on state outside its key (random generators, the user's modules): its result is the
            # variant of that state now (loading/vary.py).
            res.close()
            names = [str(n) for n in meta[vary_mod.MARKER]]
            variant_key = vary_mod.variant_key(ck.key, names)
            if variant_key is None:
                log.debug("not serving %s: %s", loader.name, _CODE_CHANGED)
                return fn(*args, **kwargs)
            variant = key.CacheKey(variant_key, ck.summary, ck.ambient, ck.described)
            return _cached_call(loader, variant, args, kwargs, recheck, arguments, vary=names)
        try:
            try:
                obj = prebuilt.take(ck.key, res.entry["entry_id"], arguments)  # an 'overmind run' template's
            except BaseException:
                res.close()
                raise
            ahead = obj is not prebuilt.NOTHING
            if ahead:
                res.close()
            else:
                obj = codec.decode(res.entry, res.fds, arguments)
            warned = loader_warnings.Replay(meta.get("warnings"), call_frame)
            logged = loader_logs.Replay(meta.get("logs"))
            other_logging = logged.differs()  # after the rebuild: the libraries it imports have set their loggers
            log.info("hit %s (entry %s, %d bytes%s) in %.3f s", loader.name, ck.key[:12],
                     res.entry.get("nbytes", 0), ", built ahead by the template" if ahead else "",
                     time.perf_counter() - t0)
        except arguments_ref.ArgumentMismatch as e:
            # This call's objects do not fit where the entry holds arguments: the entry is sound, the call is not
            # the one it was made for (a key that should have told them apart). Plain call; the entry stays.
            fallback.step_aside(f"overmind: entry {ck.key[:12]} of {loader.name} does not fit this call's arguments "
                                f"({e}); loaded without the cache. Please report this.", e)
            return fn(*args, **kwargs)
        except Exception as e:
            interrupts.raise_users(e)
            with interrupts.suppress(Exception):  # out of service in the server: the next load republishes it
                client.mark_bad(ck.key, res.entry["entry_id"])
            # The entry is out of service now (mark_bad): the next load publishes it again, so there is nothing
            # to evict; a fix that names a command must work as written.
            fallback.step_aside(f"overmind: cannot rebuild entry {ck.key[:12]} of {loader.name} "
                                f"({type(e).__name__}: {fallback.brief(e)}); loaded without the cache, and the "
                                f"server no longer serves that entry (the next load publishes it again). If "
                                f"this repeats, run 'overmind doctor' and report it.", e)
            return fn(*args, **kwargs)
        if other_logging is not None:  # the loader would not have logged what the entry holds: plain call
            del obj
            log.debug("not serving entry %s of %s: %s", ck.key[:12], loader.name, other_logging)
            return fn(*args, **kwargs)
        after = meta.get(randomness.AFTER)
        if after:  # the generators where the plain call leaves them
            randomness.restore(after)
        # The loader's warnings and log records, as the plain call gives them; outside the fallback: an "error"
        # filter raises here
        warned.issue(between=logged.emit)
        return obj
    if res.status == "refused":  # larger than the whole budget, found by an earlier load: plain, at plain speed
        fallback.step_aside(f"overmind: not caching {loader.name}: {(res.refusal or {}).get('message', 'refused')}; "
                            f"loaded plainly.", BudgetRefused())
        return fn(*args, **kwargs)
    if res.status != "claimed":
        fallback.step_aside(f"overmind: another process is still loading {loader.name} (entry {ck.key[:12]}) after "
                            f"{wait_s:.0f} s; loaded without the cache. Raise "
                            f"OVERMIND_WAIT_TIMEOUT to wait longer.")
        return fn(*args, **kwargs)

    try:
        room = res.room  # None: this process started the server (it holds nothing yet)
        first = started or res.first  # a server this process started has marked nothing yet
        return _load_claimed(client, loader, ck, args, kwargs, recheck, arguments, stack, call_frame, vary, room,
                             first and not admission_by_reuse.publishes_first())
    except BaseException:
        # The loader raised, or Ctrl-C / a signal handler's exception arrived anywhere while this call held the
        # claim: give it back now, or other processes wait on it until this connection closes.
        _release(client, ck.key)
        raise
    finally:
        if started:
            with _start_lock:
                _start_claims.pop(ck.key).set()
                _start_waited.discard(ck.key)


def _load_claimed(client, loader: key.Loader, ck: key.CacheKey, args: tuple, kwargs: dict,
                  recheck: _Recheck | None, arguments: dict | None, stack: list, call_frame: Any = None,
                  vary: list[str] | None = None, room: int | None = None, first: bool = False) -> Any:
    """Run the loader under this call's claim, then publish; exceptions of the loader propagate. The warnings it
    issues are shown as plain shows them, and kept in the entry for hits (``replay/loader_warnings.py``). A loader that
    drew from the global generators is published as a variant of its call (loading/randomness.py). ``first``: the
    key's first load, which publishes only where it is reused meanwhile (``admission_by_reuse.py``)."""
    fn = loader.fn
    run = fallback.LoaderRun(outermost=not stack)
    stack.append(ck.key)
    t0 = time.perf_counter()
    # The loader's large CPU allocations go straight into the memfd that becomes the entry (shm/arena.py); a first
    # load, which most often publishes nothing, allocates as plain does.
    load_arena = None if first else arena.open_arena()
    try:
        try:
            with gc_pause.paused():  # the states a hit must reproduce, copied: no collection over the heap meanwhile
                generators = randomness.snapshot()
                modules_before, call_start_ns = code_deps.modules_now(), time.time_ns()
                arguments_before = argument_writes.before(arguments)
                state_before = writes_recording.start()
            with loader_warnings.recording(call_frame) as warned, \
                    loader_logs.recording(lambda: len(warned.records)) as logged, \
                    _following_draws(generators) as draws:
                result = fn(*args, **kwargs)
            with gc_pause.paused():
                wrote = writes_recording.finish(state_before)
                changed = argument_writes.since(arguments_before)
        finally:
            stack.pop()
            if load_arena is not None:
                load_arena.close()
        run.finished()
        t1 = time.perf_counter()
        log.info("miss %s (entry %s): the loader ran in %.3f s", loader.name, ck.key[:12], t1 - t0)
        unsure = warned.unsure or logged.unsure
        if unsure is not None:  # a hit could not warn or log as this call did: not cached (slow, never wrong)
            _release(client, ck.key)
            log.debug("not caching %s: %s", loader.name, unsure)
            return result
        if wrote.unreplayable is not None:  # a hit could not leave the process as this call left it
            _release(client, ck.key)
            log.info("not caching %s: %s, which a hit cannot do in its place", loader.name, wrote.unreplayable)
            return result
        if changed.unreplayable is not None:  # nor leave the caller's module as this call left it
            _release(client, ck.key)
            log.info("not caching %s: it changed %s, which a hit cannot do to the caller's module", loader.name,
                     changed.unreplayable)
            return result
        drew = randomness.movement(generators)
        if drew.unseeded:  # the snapshot said unseeded, so a tracker followed the call
            kept = draws.verdict(result)
            if kept is not None:  # each unseeded process draws its own, as plain does
                _release(client, ck.key)
                _say_kept_once(loader.name, kept)
                return result
        code, code_refusal = code_deps.dependencies(fn, modules_before, call_start_ns)
        names = drew.names + code
        unvaried = code_refusal or _unvaried(drew, names, vary)
        if unvaried is not None:  # no entry can say what this result came from: not cached
            _release(client, ck.key)
            log.debug("not caching %s: %s", loader.name, unvaried)
            return result
        target = ck
        restored = [n for n in drew.names if n not in drew.unseeded]  # an unseeded generator is left as it is
        after = {randomness.AFTER: randomness.encode_after(restored)} if restored else None
        if names and vary is None:
            variant_key = vary_mod.variant_key(ck.key, names, generators)
            if variant_key is None:
                _release(client, ck.key)
                log.debug("not caching %s: %s", loader.name, _CODE_CHANGED)
                return result
            target = key.CacheKey(variant_key, ck.summary, ck.ambient, ck.described)
        if first and ck.key not in _start_waited and \
                not admission_by_reuse.publishes_now(client, loader.name, ck, result, t1 - t0):
            # marked: the next load of the key publishes (the server released the claim). A result whose weights are
            # untouched checkpoint pages is keyed as the entry's rebuild will be, when it is passed to a later load.
            admission_by_reuse.remember_result(result, target.key, arguments)
            return result
        refusal = _admission(client, target, result, room)
        if refusal is not None:  # the entry cannot be admitted: known before anything is pickled or written
            _release(client, ck.key)
            fallback.step_aside(f"overmind: not caching {loader.name}: {refusal}; returned the plain result.",
                                BudgetRefused(refusal))
            return result
        try:
            rebuilt = publish(client, loader, target, result, arguments, recheck, load_arena, warned.records,
                              logged.for_entry(), after, wrote.writes + changed.writes)
            if target is not ck:  # the call's key names what its variants vary with
                _publish_marker(client, loader, ck, names)
            log.info("published %s (entry %s%s) in %.3f s", loader.name, ck.key[:12],
                     f", a variant by {', '.join(_short(n) for n in names)}" if names else "",
                     time.perf_counter() - t1)
        except (KeyChanged, codec.UnexpectedMeta, WritesNotKept) as e:  # not what the key describes, or not all of
            # what the call did can be kept: not cached
            _release(client, ck.key)
            log.info("not caching %s: %s", loader.name, e)
            return result
        except Exception as e:
            interrupts.raise_users(e)
            _release(client, ck.key)
            run.not_cached(loader.name, e)  # one user call, one warning: a nested load may have said it already
            return result
    finally:
        if load_arena is not None:
            load_arena.release()
    del result  # the plain result's memory goes now, and back to the system below
    if not stack:
        heap_trim.trim()  # the plain result's freed heap (~0.4 GiB for a pipeline converted to fp16) back to the system
    return rebuilt


@contextlib.contextmanager
def _following_draws(generators: dict) -> Iterator[Any]:
    """Follow the loader's draws (``draws/tracker.py``) where the program has not seeded torch's generator: only
    there can a result that keeps no drawn value be served to other processes without their states. None
    elsewhere: the generators' movement is then never unseeded (``randomness.movement``)."""
    if not randomness.unseeded_in(generators):
        yield None
        return
    from .draws import tracker

    follower = tracker.following()
    try:
        yield follower
    finally:
        tracker.stop(follower)


_said_kept: set[str] = set()


def _say_kept_once(name: str, why: str) -> None:
    """One INFO line per process (DEBUG after it) for a loader whose result keeps drawn values."""
    level = logging.DEBUG if _said_kept else logging.INFO
    _said_kept.add(name)
    log.log(level, "not caching %s: %s, and the program has not seeded torch's generator, so each process draws "
            "its own as plain does (seed it, torch.manual_seed, to have it cached per seed)", name, why)


class BudgetRefused(OvermindError):
    """The server cannot admit the result's entry under its budget (``server/admission.py``); the message says
    how large it is, the budget, and what to change."""

    has_fix = True  # the message carries its advice


def _admission(client, ck: key.CacheKey, result: Any, room: int | None) -> str | None:
    """Why the server will not admit ``result``'s entry (None: it will, or it cannot be told before writing). Only
    a result larger than the ``room`` the claim reported is estimated exactly and asked about."""
    from ..entries import estimate

    try:
        found = estimate.storages(result)
        if found is None or (room is not None and estimate.total(found) <= room):
            return None
        need = estimate.entry_bytes(found)
        if need == 0:
            return None
        verdict = client.admit(ck.key, need)
    except Exception as e:  # an older server, or no answer: the publish's own check still holds
        interrupts.raise_users(e)
        log.debug("admission of %s not asked: %s", ck.key[:12], e)
        return None
    return None if verdict.get("admitted", True) else str(verdict.get("message") or "refused by the budget")


def _short(name: str) -> str:
    """A vary name for a log line: a generator's name, a module's file name."""
    if name.startswith(code_deps.PREFIX):
        return os.path.basename(name)
    return f"the random generator {name}"


def _unvaried(drew: randomness.Movement, names: list[str], vary: list[str] | None) -> str | None:
    """Why a call cannot be published as a variant (None: it can)."""
    if drew.unrepeatable:
        return (f"it drew from global random generators {', '.join(drew.unrepeatable)} in a state no other process "
                f"starts from (seeded from the OS, or a CUDA device it initialised); seed them before the load "
                f"(torch.manual_seed) to have it cached")
    if vary is not None and not set(names) <= set(vary):
        return (f"it depends on {', '.join(sorted(set(names) - set(vary)))} besides what its entry varies with "
                f"({', '.join(vary)})")
    return None


def _publish_marker(client, loader: key.Loader, ck: key.CacheKey, names: list[str]) -> None:
    """Publish under the call's key the marker that sends hits to the variant of their generators' states."""
    encoded = codec.encode(None, loader, ck.summary)
    encoded.meta[vary_mod.MARKER] = list(names)
    _publish(client, ck, encoded).close()


def _release(client, cache_key: str) -> None:
    try:
        client.release(cache_key)
    except Exception as e:  # the server is gone: the claim went with the connection
        interrupts.raise_users(e)
        log.debug("release of %s failed: %s", cache_key[:12], e)


class WritesNotKept(OvermindError):
    """The result pickles, but a value its loader wrote outside it does not: a hit could not write it."""


def _pickles_alone(result: Any, loader: key.Loader, ck: key.CacheKey, arguments: dict | None) -> bool:
    """Whether ``result`` pickles without its loader's writes (asked only after the two failed together)."""
    try:
        encoded = codec.encode(result, loader, ck.summary, arguments, reference_mapped=False)
    except Exception as e:
        interrupts.raise_users(e)
        return False
    os.close(encoded.fd)
    for _, fd in encoded.files:
        os.close(fd)
    return True


class KeyChanged(OvermindError):
    """The call's key is not what it was before the loader ran: the result is returned, not published."""


def publish(client, loader: key.Loader, ck: key.CacheKey, result: Any, arguments: dict | None = None,
            recheck: _Recheck | None = None, load_arena: arena.Arena | None = None,
            warned: list | None = None, logged: dict | None = None, extra_meta: dict | None = None,
            writes: list | None = None) -> Any:
    """Write ``result`` as an entry, publish it under ``ck`` and return it rebuilt from there, or ``result`` itself
    where a rebuild would gain nothing (:func:`_plain_result_will_do`).

    The publish reply is a hit on the entry, so the result comes back from the cache's bytes in one round trip.
    ``recheck`` runs once the result is pickled (so an adapter's refusal, which says why, comes first) and
    before anything is written: a key that changed raises :class:`KeyChanged`. ``load_arena``: the loader's
    closed arena, whose memfd becomes the entry (``shm/arena.py``). ``warned``: the loader's warnings, which a hit
    issues again (``loader_warnings.Recording.records``); ``logged``: its log records and the logging answers it
    got (``loader_logs.Recording.for_entry``). ``extra_meta``: more of the entry's meta (a variant's generator
    states after the call). ``writes``: what the loader wrote outside its result (``writes/changes.Write``), kept in
    the entry and replayed on every hit; the key is checked with them taken back, as the call found the state.
    """
    def before_write() -> None:
        what = None
        if recheck is not None:
            if writes:
                with writes_replay.taken_back(writes):
                    what = recheck.changes(ck)
            else:
                what = recheck.changes(ck)
        if what is not None:
            raise KeyChanged(f"{loader.name} changed {what} while it loaded; a hit cannot make that change to "
                             f"the objects of another call, so this call runs plain each time")

    expect_meta = torch_state.makes_meta(ck.ambient)
    kept = writes_replay.for_entry(writes, result) if writes else None
    changes_arguments = any(held(w.place) for w in writes or ())
    index = None
    if changes_arguments:  # its module arguments' parts by where they were as it found them
        with writes_replay.taken_back(writes or []):
            index = arguments_ref.ArgumentIndex(arguments, into_modules=True)
    try:
        try:
            encoded = codec.encode(result, loader, ck.summary, arguments, before_write=before_write,
                                   arena=load_arena, expect_meta=expect_meta, writes=kept, argument_index=index)
        except pickling.PicklingFailed as e:
            if kept and _pickles_alone(result, loader, ck, arguments):
                raise WritesNotKept(f"{loader.name} wrote a value outside its result that cannot be kept for a hit "
                                    f"({fallback.brief(e)}), so this call runs plain each time") from e
            raise
        res = _publish(client, ck, encoded, warned, logged, extra_meta)
    except (ServerError, codec.FileChanged) as e:
        if e.reason not in _COPY_INSTEAD:
            raise
        # An entry this one references was evicted meanwhile, or a checkpoint file it references changed: write
        # the bytes themselves instead.
        encoded = codec.encode(result, loader, ck.summary, arguments, reference_mapped=False, expect_meta=expect_meta,
                               writes=kept, argument_index=index)
        res = _publish(client, ck, encoded, warned, logged, extra_meta)
    if changes_arguments or _plain_result_will_do(result, encoded):
        # (a call that changed its module arguments returns its own result: the caller's modules hold its parts)
        for fd in res.fds.values():
            os.close(fd)
        return result
    replace = (lambda: writes_replay.take_back(writes)) if writes else None
    return codec.decode(res.entry, res.fds, arguments, replace_writes=replace)


def _plain_result_will_do(result: Any, encoded: codec.Encoded) -> bool:
    """Whether the miss returns the loader's own result rather than its rebuild from the entry just published.

    Rebuilding serves two ends: the process then shares the result's weights with the others (the loader's
    heap copies are freed), and a module or tensor rebuilt from an entry is keyed by that entry when it is
    passed to a later load (``keys/provenance.py``). A result that gains neither is returned as the loader made
    it, the plain call's own object: one that is not a module or tensor, and whose storages (if any) all lie
    where this process already shares them with the others, in the pages of an entry it maps or of a
    checkpoint file. That is a tokenizer, a scheduler or a config (no storage: ~60 ms for a pipeline's
    tokenizer), and a pipeline whose components came from nested loads (their entries' pages: ~0.14 s for the
    blog's pipeline). A result with any storage of its own in the entry, however small, is rebuilt.
    """
    return not encoded.owns_storages and not provenance.tracked(result)


_COPY_INSTEAD = ("dep missing", "file changed")


def _publish(client, ck: key.CacheKey, encoded: codec.Encoded, warned: list | None = None,
             logged: dict | None = None, extra_meta: dict | None = None):
    if extra_meta:
        encoded.meta.update(extra_meta)
    if warned:
        encoded.meta["warnings"] = warned
    if logged:
        encoded.meta["logs"] = logged
    try:
        return client.publish_hit(ck.key, encoded.fd, deps=encoded.deps, meta=encoded.meta, files=encoded.files)
    finally:
        os.close(encoded.fd)
        for _, fd in encoded.files:
            os.close(fd)
