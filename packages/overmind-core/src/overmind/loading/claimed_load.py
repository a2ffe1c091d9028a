"""A claimed load: the loader run under this process's claim on its key, with what a hit must do
again recorded around it (its warnings and log records, its draws from the global random generators,
its writes to process state and to its module arguments, the user's modules it depends on), and
whether an entry can stand for what it did.
"""
from __future__ import annotations

import contextlib
import logging
import time
from types import FrameType
from typing import Any, Callable, Iterator

from .. import fallback
from .._util import gc_pause
from ..keys import key
from ..shm import arena
from . import code_deps, randomness
from .replay import loader_logs, loader_warnings
from .writes import arguments as argument_writes
from .writes import changes
from .writes import recording as writes_recording

log = logging.getLogger("overmind")


class NotCached:
    """Why a claimed load's result gets no entry, said (:meth:`say`) once its claim is given
    back."""

    def __init__(self, say: Callable[..., None], *args: Any) -> None:
        self._say, self._args = say, args

    def say(self) -> None:
        self._say(*self._args)


class ClaimedLoad:
    """One loader run under this call's claim, from its start (the call's key on ``stack``, the load
    arena open) to :meth:`release_arena`: :meth:`run` runs the loader and records what it did
    besides returning, :meth:`why_not_cached` says whether an entry can stand for that. ``first``:
    the key's first load, which allocates as plain does (``admission_by_reuse.py``)."""

    warned: loader_warnings.Recording
    logged: loader_logs.Recording
    wrote: changes.Found
    changed: argument_writes.Found
    ended: float  # perf_counter when the loader returned
    names: list[str]  # what the result varies with beyond its key (``vary.py``)
    after: dict | None  # the entry's meta that puts the generators where the call left them

    def __init__(self, loader: key.Loader, ck: key.CacheKey, stack: list, first: bool) -> None:
        self.loader, self.ck, self.stack = loader, ck, stack
        self.loader_run = fallback.LoaderRun(outermost=not stack)
        stack.append(ck.key)
        self.began = time.perf_counter()
        # The loader's large CPU allocations go straight into the memfd that becomes the entry
        # (shm/arena.py); a first load, which most often publishes nothing, allocates as plain does.
        self.arena = None if first else arena.open_arena()

    def run(self, args: tuple, kwargs: dict, arguments: dict | None,
            call_frame: FrameType | None) -> Any:
        """The loader's result; its exceptions propagate. The warnings it issues are shown as plain
        shows them and kept for hits (``replay/loader_warnings.py``), as are its log records; the
        states a hit must reproduce are copied before it runs, and what it changed is found after.
        ``call_frame``: the cached call's frame, whose callers a warning of the loader may name."""
        try:
            # the states a hit must reproduce, copied: no collection over the heap meanwhile
            with gc_pause.paused():
                self.generators = randomness.snapshot()
                self.modules_before, self.call_start_ns = code_deps.modules_now(), time.time_ns()
                arguments_before = argument_writes.before(arguments)
                state_before = writes_recording.start()
            with loader_warnings.recording(call_frame) as warned, \
                    loader_logs.recording(lambda: len(warned.records)) as logged, \
                    _following_draws(self.generators) as draws:
                result = self.loader.fn(*args, **kwargs)
            with gc_pause.paused():
                wrote = writes_recording.finish(state_before)
                changed = argument_writes.since(arguments_before)
        finally:
            self.stack.pop()
            if self.arena is not None:
                self.arena.close()
        self.warned, self.logged, self.draws = warned, logged, draws
        self.wrote, self.changed = wrote, changed
        self.loader_run.finished()
        self.ended = time.perf_counter()
        log.info("miss %s (entry %s): the loader ran in %.3f s", self.loader.name, self.ck.key[:12],
                 self.ended - self.began)
        return result

    def why_not_cached(self, result: Any, vary: list[str] | None) -> NotCached | None:
        """Why no entry can stand for what the loader did; None where one can, and :attr:`names`
        then says what the result varies with beyond its key, :attr:`after` where a hit leaves the
        generators. ``vary``: the names the call's entry varies with, where this is a variant."""
        name = self.loader.name
        unsure = self.warned.unsure or self.logged.unsure
        if unsure is not None:  # a hit could not warn or log as this call did (slow, never wrong)
            return NotCached(log.debug, "not caching %s: %s", name, unsure)
        if self.wrote.unreplayable is not None:  # a hit could not leave the process as this did
            return NotCached(log.info, "not caching %s: %s, which a hit cannot do in its place",
                             name, self.wrote.unreplayable)
        if self.changed.unreplayable is not None:  # nor leave the caller's module as this did
            return NotCached(log.info, "not caching %s: it changed %s, which a hit cannot do to "
                             "the caller's module", name, self.changed.unreplayable)
        drew = randomness.movement(self.generators)
        if drew.unseeded:  # the snapshot said unseeded, so a tracker followed the call
            kept = self.draws.verdict(result)
            if kept is not None:  # each unseeded process draws its own, as plain does
                return NotCached(_say_kept_once, name, kept)
        code, code_refusal = code_deps.dependencies(self.loader.fn, self.modules_before,
                                                    self.call_start_ns)
        names = drew.names + code
        unvaried = code_refusal or _unvaried(drew, names, vary)
        if unvaried is not None:  # no entry can say what this result came from
            return NotCached(log.debug, "not caching %s: %s", name, unvaried)
        # an unseeded generator is left as it is
        restored = [n for n in drew.names if n not in drew.unseeded]
        self.names = names
        self.after = {randomness.AFTER: randomness.encode_after(restored)} if restored else None
        return None

    @property
    def writes(self) -> list[changes.Write]:
        """What the loader wrote outside its result: to process state, then to its module
        arguments."""
        return self.wrote.writes + self.changed.writes

    def release_arena(self) -> None:
        """Done with the load arena: the entry is written, or given up."""
        if self.arena is not None:
            self.arena.release()


@contextlib.contextmanager
def _following_draws(generators: dict) -> Iterator[Any]:
    """Follow the loader's draws (``draws/tracker.py``) where the program has not seeded torch's
    generator: only there can a result that keeps no drawn value be served to other processes
    without their states. None elsewhere: the generators' movement is then never unseeded
    (``randomness.movement``)."""
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
    log.log(level, "not caching %s: %s, and the program has not seeded torch's generator, so "
            "each process draws its own as plain does (seed it, torch.manual_seed, to have it "
            "cached per seed)", name, why)


def _unvaried(drew: randomness.Movement, names: list[str], vary: list[str] | None) -> str | None:
    """Why a call cannot be published as a variant (None: it can)."""
    if drew.unrepeatable:
        return (f"it drew from global random generators {', '.join(drew.unrepeatable)} in a state "
                f"no other process starts from (seeded from the OS, or a CUDA device it "
                f"initialised); seed them before the load (torch.manual_seed) to have it cached")
    if vary is not None and not set(names) <= set(vary):
        return (f"it depends on {', '.join(sorted(set(names) - set(vary)))} besides what its entry "
                f"varies with ({', '.join(vary)})")
    return None
