"""An interrupt anywhere in a recording leaves ``logging`` and ``warnings`` as plain has them.

A signal handler's exception (Ctrl-C, a deadline) arrives in the main thread wherever the interpreter runs
handlers: as a function starts, at a loop's head, after any call returns. Landing halfway through the hooks going
in (``loader_logs._start``), a later recording once saved Overmind's own ``isEnabledFor`` as the library's and
every log call after it recursed until Python gave up (found by ``test_soak`` in CI).

Here a tracer raises ``KeyboardInterrupt`` at each such point in turn, the n-th of them for n = 0, 1, 2, …, in the
code of the recordings (``recordings``, ``loader_logs``, ``loader_warnings``) and of ``contextlib``, while a body
warns, logs, calls a once-only method and nests a second recording, as ``loading/claimed_load.py`` runs a loader.
For every n: the interrupt reaches the caller unchanged; what the user does before the next load (a warning already
shown, a log call, the once-only call already made) shows what plain shows; and after one whole load, which records
all it should, ``Logger``, ``warnings.filters``, the show hook and the modules' warning registries are as they were
before any of it. Mutations this fails on: ``start`` saving its own hook as the library's, a recording leaving
its stack before the hooks are out, recordings whose ``with`` ended not dropped.
"""
from __future__ import annotations

import collections
import contextlib
import dis
import functools
import gc
import logging
import sys
import warnings

import pytest

from overmind.loading.replay import loader_logs, loader_warnings, recordings

_FILES = {recordings.__file__, loader_logs.__file__, loader_warnings.__file__, contextlib.__file__}
_CALLS = {"CALL", "CALL_FUNCTION_EX"}  # (3.11's PRECALL only prepares one; its specialized forms that call skip
#                                          the CALL after them, and check where the CALL would have)
LOG = logging.getLogger("overmind_tests_interrupted")


@functools.lru_cache(None)
def _notice_once(self, *args):
    self.warning(*args)


@functools.lru_cache(None)
def _check_points(code) -> tuple[frozenset[int], dict[int, frozenset[int]]]:
    """Where a handler's exception can surface in ``code``: before its first instruction, after each call, at each
    loop head (the instructions the interpreter checks for pending signals at or right before); and each loop
    head's lines (the loop's body)."""
    ins = list(dis.get_instructions(code))
    points = {ins[0].offset} if ins else set()
    loops: dict[int, frozenset[int]] = {}
    line = code.co_firstlineno
    lines_at = {}
    for x in ins:
        if x.positions is not None and x.positions.lineno is not None:
            line = x.positions.lineno
        lines_at[x.offset] = line
    for i, x in enumerate(ins):
        if x.opname == "RESUME":
            points.add(x.offset)
        if x.opname in _CALLS and i + 1 < len(ins):
            points.add(ins[i + 1].offset)
        if x.opname.startswith("JUMP_BACKWARD") and isinstance(x.argval, int):
            points.add(x.argval)
            loops[x.argval] = frozenset(lines_at[o] for o in lines_at if x.argval <= o <= x.offset)
    return frozenset(points), loops


class _InterruptAt:
    """A tracer that raises ``KeyboardInterrupt`` at the ``n``-th check point reached in ``_FILES``' code. A point
    counts at its first two visits in a run: later ones repeat a loop's or a hook's step in a state one of those
    saw (the hundreds of modules ``_set_aside_registries`` reads, the hooks called at every log call), and a loop
    from its third turn on is followed by its lines alone."""

    def __init__(self, n: int) -> None:
        self.n, self.seen, self.fired, self.where = n, 0, False, ""
        self.visits: collections.Counter = collections.Counter()
        self.skipping: dict = {}  # {frame: the lines of the loop it is in, past its second turn}

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if code.co_filename not in _FILES or all(self.visits[code, p] >= 2 for p in _check_points(code)[0]):
            return None  # not the recordings' code, or every point of it already counted twice
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame, event, arg):
        if event == "line":
            lines = self.skipping.get(frame)
            if lines is not None and frame.f_lineno not in lines:
                del self.skipping[frame]  # out of the loop: every instruction again
                frame.f_trace_opcodes = True
            return self._local
        if event != "opcode":
            if event == "return":
                self.skipping.pop(frame, None)
            return self._local
        points, loops = _check_points(frame.f_code)
        at = frame.f_lasti
        if at in points:
            key = (frame.f_code, at)
            self.visits[key] += 1
            if self.visits[key] > 2:
                if at in loops:
                    self.skipping[frame] = loops[at]
                    frame.f_trace_opcodes = False
                return self._local
            if self.seen == self.n:
                self.fired = True
                self.where = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
                raise KeyboardInterrupt(f"check point {self.n}")
            self.seen += 1
        return self._local


def _body() -> None:
    warnings.warn("the loader's warning", UserWarning, stacklevel=1)
    LOG.warning("the loader's record")
    LOG.overmind_test_notice_once("the loader's notice")
    with loader_warnings.recording(sys._getframe()) as w, loader_logs.recording(lambda: len(w.records)):  # nested
        warnings.warn("the nested loader's warning", UserWarning, stacklevel=1)
        LOG.warning("the nested loader's record")


def _load(body=_body) -> tuple:
    """A load as ``loading/claimed_load.py`` runs it: the two recordings around the loader, in a frame of its own."""
    with loader_warnings.recording(sys._getframe()) as w, loader_logs.recording(lambda: len(w.records)) as logged:
        body()
    return w, logged


def _warn_shown_before() -> None:
    warnings.warn("shown before any load", UserWarning, stacklevel=1)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_SHOWN: list[str] = []


def _shown(fn) -> list[str]:
    """The warnings ``fn`` shows under the user's "default" filter, whose registries count what was shown (the
    filters stay as they are all along: a change would empty every registry)."""
    _SHOWN.clear()
    fn()
    return list(_SHOWN)


@pytest.fixture
def user_setup():
    logging.Logger.overmind_test_notice_once = _notice_once
    kept = _Kept()
    LOG.addHandler(kept)
    LOG.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, *a, **k: _SHOWN.append(str(message))
            yield kept
    finally:
        LOG.removeHandler(kept)
        LOG.propagate = True
        del logging.Logger.overmind_test_notice_once
        _notice_once.cache_clear()


def _state() -> tuple:
    return (dict(vars(logging.Logger)), warnings._showwarnmsg, list(warnings.filters),  # type: ignore[attr-defined]
            dict(loader_logs._saved.get("once", {})), "registries" in loader_warnings._saved)


def _differences(a: tuple, b: tuple) -> list:
    out = [k for k in set(a[0]) | set(b[0]) if a[0].get(k) is not b[0].get(k)]
    return out + [i for i in range(1, len(a)) if a[i] != b[i]]


def test_an_interrupt_at_any_point_of_a_recording_leaves_logging_and_warnings_as_plain(user_setup):
    kept = user_setup
    gc.collect()  # a finalizer of an earlier test's garbage (an unclosed file warns) would speak inside a load
    _load(lambda: None)  # the modules the recordings use are imported, their caches warm
    assert _shown(_warn_shown_before) == ["shown before any load"]
    LOG.overmind_test_notice_once("the user's notice")
    before = _state()
    points = None
    for n in range(100_000):
        kept.messages.clear()
        tracer = _InterruptAt(n)
        interrupted = False
        sys.settrace(tracer)
        try:
            _load()
        except KeyboardInterrupt as e:
            interrupted = True
            assert str(e) == f"check point {n}"
        finally:
            sys.settrace(None)
        assert interrupted == tracer.fired, f"check point {n} ({tracer.where}): the interrupt did not reach the caller unchanged"
        for running in (loader_warnings._RUNNING, loader_logs._RUNNING):  # a lock left held stops every other thread
            assert not running._lock._is_owned(), f"check point {n} ({tracer.where}): a lock is still held"
        if not tracer.fired:
            points = n
            break

        # Before the next load, what is left behaves as plain.
        kept.messages.clear()
        assert _shown(_warn_shown_before) == [], f"check point {n} ({tracer.where}): a warning shown before showed again"
        LOG.warning("the user's record")
        LOG.overmind_test_notice_once("the user's notice")
        assert kept.messages == ["the user's record"], f"check point {n} ({tracer.where}): {kept.messages}"

        # One whole recording: it records what it should, and everything is as it was before any of it.
        kept.messages.clear()
        w, logged = _load()
        assert w.unsure is None and logged.unsure is None, f"check point {n} ({tracer.where}): {w.unsure or logged.unsure}"
        assert [r["args"] for r in w.records] == [["the loader's warning"], ["the nested loader's warning"]]
        assert [r.get("msg", r.get("args")) for r in logged.records] == [
            "the loader's record", ["the loader's notice"], "the nested loader's record"], f"check point {n}"
        assert _state() == before, f"check point {n} ({tracer.where}): not put back: {_differences(before, _state())}"
        assert _shown(_warn_shown_before) == [], f"check point {n} ({tracer.where}): the registry set aside did not come back"
    assert points is not None and points > 100, points  # every point of a whole recording was tried
