"""The log records a loader emits: recorded on a miss with every ``isEnabledFor`` and ``getEffectiveLevel`` answer
the loader got, kept in the entry's meta, handed again on a hit to the same loggers' ``handle``, in the plain order
among the warnings; a process whose logging answers otherwise runs the plain loader.

A plain call logs while its loader runs (diffusers' "You have disabled the safety checker" notice, a library's
deprecation note): its logger checks ``isEnabledFor``, makes a record and hands it to ``Logger.handle``, which
applies the logger's filters and passes it to the handlers. A hit runs no loader, so a miss records every record
handled in its thread, and a hit hands an equal record (name, level, message, file, line, function, exception
and stack text, extra attributes) to the same logger's ``handle`` in the hit process: its filters, handlers and
formatters treat it as they would treat the plain call's. The records are emitted in the plain call's order among
the loader's warnings (:mod:`.loader_warnings`).

What the loader saw of the logging configuration decides what it logged: a record exists only where
``isEnabledFor`` said yes, and a loader may branch on ``getEffectiveLevel()``. A miss therefore records every
answer those two gave the loader; a hit in a process whose logging answers any of them differently (another
verbosity, ``logging.disable``) is not served: the plain loader runs instead (a debug line says why).

A record a library logs once per process (transformers' ``warning_once``/``info_once``: methods on ``Logger``
cached with ``functools.lru_cache`` on the logger and the arguments) depends on what this process logged before:
the plain call emits it the first time and stays silent after, whether the first time was in a load or not. So
a miss records the *call* (method, logger, arguments), seen through a stand-in for each such method while the
recording runs, and not the record it may make; a hit makes the same call, through the same cached method of
the hit process, which emits the record or not as plain would (the record's place is the method's own line, in
both). A method defined while the loader runs (the loader is the first to import transformers) has no stand-in;
its cache began empty, so the calls that matter are those that run its body, which are noted from the body's
frame as it asks ``isEnabledFor`` (a call its cache answers silently repeats one already noted, and a hit
repeats it too). A call that passes keyword arguments (``stacklevel``, ``stack_info``, ``exc_info`` would name
Overmind's frames in a hit) or arguments that are not plain values leaves the result uncached, and so does a
call Overmind did not see (the method's cache counts calls the recording did not: another thread, the cached
function called directly). The stand-in's code is filed under ``logging``'s own source file, so ``findCaller``
skips its frame as one of ``logging``'s.

When in doubt, the result is not cached (:attr:`Recording.unsure`): another thread logged while the loader
ran, a record carries an attribute of its own that is not a plain value, or its message could not be made. So
too when the loader changed how logging is set up (a logger's level, handlers, ``propagate`` or ``disabled``,
``logging.disable``): a hit would leave the process as it found it. Loggers made while the loader ran are not
compared (an import makes them, in a hit as in plain).

One change of the set-up is made again instead: ``basicConfig()`` without arguments on a root logger that had
no handler, which a module-level ``logging.info()`` / ``logging.warning()`` (open_clip's ``create_model``) makes
whenever the root logger has none, whatever the level: every later record of the process then reaches standard
error. The miss notes where among its records the root logger gained the handler that ``basicConfig()`` adds (a
``StreamHandler`` on standard error, ``logging.BASIC_FORMAT``, nothing else changed), and a hit calls
``logging.basicConfig()`` at that place, which does nothing where the root logger has a handler, as the plain call
would.
Not reproduced: progress bars (they are written to the terminal, not logged) and the records of a ``Logger``
subclass that overrides ``handle`` (the recording sits in ``Logger.handle``).
"""
from __future__ import annotations

import functools
import logging
import sys
import threading

from ..._util import interrupts
from . import recordings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable

_saved: dict[str, Any] = {}  # while any recording runs: Logger's own handle, isEnabledFor and getEffectiveLevel
_SCALARS = (str, int, float, bool, type(None))
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_WARNINGS_LOGGER = "py.warnings"  # warnings shown through logging (captureWarnings): a hit replays them as warnings
_in_once = threading.local()  # depth: this thread is inside a once-only method, whose records its call stands for


class Recording(recordings.Recording):
    """The log records of one loader run and the logging answers it saw; :meth:`for_entry` goes into the entry,
    unless :attr:`unsure` says why not. ``warnings_so_far()``: how many warnings the loader has issued, which
    places each record among them."""

    def __init__(self, warnings_so_far: Callable[[], int]) -> None:
        super().__init__()
        self.records: list[dict] = []
        self.answers: dict[tuple, Any] = {}
        self._warnings_so_far = warnings_so_far
        # {once-only method name: calls this recording saw}, through a stand-in (every call) or, for a method
        # without one, by its body's frame (the calls that ran it); and each method's counts as the loader starts
        self.once_seen: dict[str, int] = {}
        self._once_at_start: dict[str, tuple[Any, int, int, bool]] = {}
        self._setup: dict[str, Any] = {}
        self._root_bare = False  # the root logger had no handler as the loader started (basicConfig() may add one)
        self.basic_config: int | None = None  # the records before the loader's basicConfig(), if it made one

    def begin(self) -> None:
        """Note the once-only methods' counts and the logging set-up as the loader starts (stand-ins in place)."""
        self._once_at_start = _once_counts()
        self._setup = _logging_setup()
        self._root_bare = not logging.root.handlers

    def finish(self) -> None:
        """The loader returned: every call the once-only methods answered meanwhile must be one this saw, and
        the logging set-up must be as the loader found it."""
        unseen = _once_unseen(self._once_at_start, self.once_seen)
        if unseen:
            self.doubt(f"the once-only log method {unseen} answered a call the recording did not see")
        now = _logging_setup()
        changed = [name for name, setup in self._setup.items() if now.get(name) != setup]
        if "root" in changed and _basic_config_made(self._setup["root"], now["root"]):
            changed.remove("root")
            self._root_changed()  # the loader called basicConfig() itself after its last record
        else:
            self.basic_config = None  # no handler added, or another one: nothing for a hit to make again
        if changed:
            names = ", ".join(map(repr, changed[:3]))
            self.doubt(f"the loader changed how logging is set up ({names}): a hit would leave it as it is")

    def once(self, logger: logging.Logger | None, name: str, method: Any, args: tuple | None, kwargs: dict) -> None:
        """Note a call of the once-only method ``name`` (``method``, the cached one), as a hit will make it;
        ``args`` None: arguments that could not be read from the method's frame."""
        self.once_seen[name] = self.once_seen.get(name, 0) + 1
        if self.unsure is not None:
            return
        if logger is None or args is None or kwargs or any(type(a) not in _SCALARS for a in args):
            self.doubt(f"the loader called the once-only log method {name} with arguments a hit could not pass "
                       f"as they were")
            return
        self.records.append({"once": name, "impl": _impl(method), "logger": logger.name, "args": list(args),
                             "after": self._warnings_so_far()})

    def for_entry(self) -> dict | None:
        if not self.records and not self.answers and self.basic_config is None:
            return None
        kept = {"records": self.records, "answers": [[n, q, a] for (n, q), a in self.answers.items()]}
        if self.basic_config is not None:  # a key an older Overmind ignores (it leaves the root logger as it is)
            kept["basic_config"] = self.basic_config
        return kept

    def answered(self, name: str, question: Any, answer: Any) -> None:
        if self._root_bare and logging.root.handlers:
            self._root_changed()
        self.answers.setdefault((name, question), answer)

    def _root_changed(self) -> None:
        """The root logger has a handler it lacked as the loader started: if ``basicConfig()`` added it, a hit
        makes it again before the records noted from now on (:func:`_basic_config_made` decides at the end)."""
        if self._root_bare and self.basic_config is None:
            self.basic_config = len(self.records)

    def note(self, logger: logging.Logger, record: logging.LogRecord) -> None:
        if self._root_bare and logging.root.handlers:
            self._root_changed()
        if self.unsure is not None:
            return
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if any(type(v) not in _SCALARS for v in extra.values()):
            self.doubt(f"the loader logged a record with attributes another process could not give it ({record.name})")
            return
        exc_text = record.exc_text
        if record.exc_info and not exc_text:
            exc_text = logging.Formatter().formatException(record.exc_info)
        self.records.append({
            "logger": logger.name, "name": record.name, "level": record.levelno, "msg": record.getMessage(),
            "pathname": record.pathname, "lineno": record.lineno, "func": record.funcName, "exc_text": exc_text,
            "stack": record.stack_info, "extra": extra, "after": self._warnings_so_far(),
        })


def _handle(self: logging.Logger, record: logging.LogRecord) -> Any:
    if (record.name != _WARNINGS_LOGGER and record.name.split(".")[0] != "overmind"  # Overmind's own: not the entry's
            and not getattr(_in_once, "depth", 0)  # a once-only method's: its call is noted, a hit makes it again
            and _once_body(_caller(sys._getframe(1))) is None):
        mine = _RUNNING.mine()
        try:
            for rec in mine:
                rec.note(self, record)
            if not mine:
                _RUNNING.doubt_other_threads("another thread logged while the loader ran")
        except Exception as e:  # Overmind's own failure (or a message that cannot be made): not cached
            interrupts.raise_users(e)
            for rec in mine:
                rec.doubt(f"recording a log record failed ({type(e).__name__}: {e})")
    return _saved["handle"](self, record)


def _is_enabled_for(self: logging.Logger, level: int) -> bool:
    answer = _saved["isEnabledFor"](self, level)
    for rec in _RUNNING.mine():
        rec.answered(self.name, level, answer)
    if not getattr(_in_once, "depth", 0):
        body = _once_body(_caller(sys._getframe(1)))
        if body is not None:  # a once-only method without a stand-in (defined while the loader ran) ran its body
            _noted_from_frame(*body)
    return answer


def _get_effective_level(self: logging.Logger) -> int:
    answer = _saved["getEffectiveLevel"](self)
    for rec in _RUNNING.mine():
        rec.answered(self.name, "effective", answer)
    return answer


def _basic_config_made(before: tuple, after: tuple) -> bool:
    """Whether the root logger's set-up went from ``before`` to ``after`` (:func:`_logging_setup`'s ``"root"``) by
    ``logging.basicConfig()`` without arguments alone: no handler before, then one ``StreamHandler`` on standard
    error with the default formatter, nothing else changed."""
    level, handlers, propagate, disabled, disable = before
    if handlers or len(after[1]) != 1 or (after[0], *after[2:]) != (level, propagate, disabled, disable):
        return False
    handler = after[1][0]
    formatter = handler.formatter
    return (type(handler) is logging.StreamHandler and handler.stream is sys.stderr
            and handler.level == logging.NOTSET and not handler.filters and type(formatter) is logging.Formatter
            and formatter._fmt == logging.BASIC_FORMAT and formatter.datefmt is None
            and type(formatter._style) is logging.PercentStyle)


def _logging_setup() -> dict[str, Any]:
    """Every logger's level, handlers, ``propagate`` and ``disabled`` (the root logger as ``"root"``), and
    ``logging.disable``'s level: what decides where a later record of the process goes."""
    manager = logging.root.manager
    setup: dict[str, Any] = {name: (lg.level, tuple(lg.handlers), lg.propagate, lg.disabled)
                             for name, lg in list(manager.loggerDict.items()) if isinstance(lg, logging.Logger)}
    root = logging.root
    setup["root"] = (root.level, tuple(root.handlers), root.propagate, root.disabled, manager.disable)
    return setup


# --- once-only methods (transformers' warning_once) ----------------------------------------------------------


def _once_methods() -> dict[str, Any]:
    """``Logger``'s once-only methods as they are now, ``{name: the cached method}`` (a stand-in gives its own)."""
    out = {}
    for name, value in vars(logging.Logger).items():
        value = getattr(value, "_overmind_stands_in_for", value)
        if isinstance(value, functools._lru_cache_wrapper):
            out[name] = value
    return out


def _once_counts() -> dict[str, tuple[Any, int, int, bool]]:
    """``{name: (method, hits, misses, has a stand-in)}`` for every once-only method: the calls each has answered
    in this process, emitting (a miss of its cache) or not (a hit)."""
    out = {}
    for name, method in _once_methods().items():
        info = method.cache_info()
        out[name] = (method, info.hits, info.misses, vars(logging.Logger)[name] is not method)
    return out


def _once_unseen(at_start: dict[str, tuple[Any, int, int, bool]], seen: dict[str, int]) -> str | None:
    """The first once-only method that answered a call a recording did not see, given its counts at the start
    and the calls it saw. With a stand-in from the start, every call is seen. Without one, only the calls that ran
    the body are (by its frame): a call the cache answered silently is unseen, unless the method was defined
    while the loader ran, when its cache began empty and each such call repeats one seen, which a hit repeats. A
    method the loader replaced is unseen too: a hit would call the one this process has, with its cache."""
    for name, (method, hits, misses, _) in _once_counts().items():
        start = at_start.get(name)
        if start is not None and start[0] is not method:
            return name
        _, hits0, misses0, stood_in = start or (None, 0, 0, False)
        calls = seen.get(name, 0)
        if stood_in:
            if hits - hits0 + misses - misses0 != calls:
                return name
        elif misses - misses0 != calls or (start is not None and hits != hits0):
            return name
    return None


def _caller(frame: FrameType | None) -> FrameType | None:
    """The first frame from ``frame`` up that is not ``logging``'s own (as ``findCaller`` finds it)."""
    while frame is not None and frame.f_code.co_filename == logging._srcfile:
        frame = frame.f_back
    return frame


def _once_body(frame: FrameType | None) -> tuple | None:
    """``(frame, name, method)`` when ``frame`` runs the body of ``Logger``'s once-only method ``name``."""
    if frame is None:
        return None
    name = frame.f_code.co_name
    method = vars(logging.Logger).get(name)
    method = getattr(method, "_overmind_stands_in_for", method)
    body = getattr(method, "__wrapped__", None)
    if isinstance(method, functools._lru_cache_wrapper) and getattr(body, "__code__", None) is frame.f_code:
        return frame, name, method
    return None


def _noted_from_frame(frame: FrameType, name: str, method: Any) -> None:
    """A once-only method without a stand-in ran its body (``def m(self, *args, **kwargs)``): note its call."""
    if vars(logging.Logger).get(name) is not method:
        return  # it has a stand-in: the stand-in noted the call (or the function was called directly: unseen)
    code, f_locals = frame.f_code, frame.f_locals
    names = code.co_varnames
    args: tuple | None = None  # another signature: its call cannot be read back
    kwargs: dict = {}
    if code.co_argcount == 1 and code.co_flags & 0x0C == 0x0C:  # (self, *args, **kwargs), CO_VARARGS|CO_VARKEYWORDS
        args, kwargs = tuple(f_locals[names[1]]), dict(f_locals[names[2]])
    _once_called(f_locals.get(names[0]) if names else None, name, method, args, kwargs)


def _impl(method: Any) -> str:
    inner = getattr(method, "__wrapped__", method)
    return f"{getattr(inner, '__module__', None)}:{getattr(inner, '__qualname__', None)}"


def _once_called(logger: logging.Logger | None, name: str, method: Any, args: tuple | None, kwargs: dict) -> None:
    mine = _RUNNING.mine()
    try:
        for rec in mine:
            rec.once(logger, name, method, args, kwargs)
        if not mine:
            _RUNNING.doubt_other_threads("another thread called a once-only log method while the loader ran")
    except Exception as e:  # Overmind's own failure: not cached
        interrupts.raise_users(e)
        for rec in mine:
            rec.doubt(f"recording a once-only log call failed ({type(e).__name__}: {e})")


def _stand_in(name: str, method: Any) -> Any:
    """A stand-in for the once-only ``method``: notes the call, then calls it. Its code is filed under
    ``logging``'s source file, so ``findCaller`` skips its frame as it skips ``logging``'s own."""

    def stand_in(self: logging.Logger, *args: Any, **kwargs: Any) -> Any:
        _once_called(self, name, method, args, kwargs)
        _in_once.depth = getattr(_in_once, "depth", 0) + 1
        try:
            return method(self, *args, **kwargs)
        finally:
            _in_once.depth -= 1

    stand_in.__code__ = stand_in.__code__.replace(co_filename=logging._srcfile or stand_in.__code__.co_filename)
    functools.update_wrapper(stand_in, method)
    stand_in._overmind_stands_in_for = method  # type: ignore[attr-defined]
    return stand_in


_PATCHED = {"handle": _handle, "isEnabledFor": _is_enabled_for, "getEffectiveLevel": _get_effective_level}


def _start() -> None:
    """The first recording of the process starts: Logger's hooks and the once-only methods' stand-ins go in. Run
    again over what an interrupted start or stop left, it completes it: a hook or stand-in already in is kept, and
    never saved as the library's own."""
    for name, replacement in _PATCHED.items():
        if vars(logging.Logger).get(name) is not replacement:
            _saved[name] = vars(logging.Logger)[name]
            setattr(logging.Logger, name, replacement)
    stand_ins = _saved.setdefault("once", {})
    for name, method in _once_methods().items():  # the cached methods, behind any stand-in of ours
        pair = stand_ins.get(name)
        if pair is None or pair[0] is not method or vars(logging.Logger).get(name) is not pair[1]:
            stand_ins[name] = pair = (method, _stand_in(name, method))
            setattr(logging.Logger, name, pair[1])


def _stop() -> None:
    """The last recording ended: Logger is as the first one found it. Safe to run again over an interrupted run:
    each hook comes out, and is forgotten, one at a time."""
    stand_ins = _saved.get("once", {})
    for name, (method, stand_in) in list(stand_ins.items()):
        if vars(logging.Logger).get(name) is stand_in:
            setattr(logging.Logger, name, method)
        del stand_ins[name]
    for name, replacement in _PATCHED.items():
        if vars(logging.Logger).get(name) is replacement:
            setattr(logging.Logger, name, _saved[name])


_RUNNING: recordings.Running[Recording] = recordings.Running(_start, _stop)


def recording(warnings_so_far: Callable[[], int]) -> recordings.Recorder[Recording]:
    """``with recording(...) as rec``: record the log records handled in this thread inside the block, and the
    logging answers it gets (:meth:`Recording.finish` checks the once-only calls and the set-up as it returns)."""
    return _RUNNING.running(Recording(warnings_so_far))


class Replay:
    """An entry's recorded log records. :meth:`differs` is checked before the hit is returned; :meth:`emit` hands
    the records to their loggers between the replayed warnings (``loader_warnings.Replay.issue``)."""

    def __init__(self, kept: dict | None) -> None:
        kept = kept or {}
        self.records: list[dict] = list(kept.get("records") or ())
        self.answers: list = list(kept.get("answers") or ())
        self.basic_config: int | None = kept.get("basic_config")  # the records before the loader's basicConfig()
        self._next = 0

    def differs(self) -> str | None:
        """The first logging answer this process gives otherwise than the miss's loader got, or ``None``; or the
        first once-only method the loader called that this process has otherwise."""
        once = [r for r in self.records if "once" in r]
        methods = _once_methods() if once else {}
        for r in once:
            here = methods.get(r["once"])
            if here is None or _impl(here) != r["impl"]:
                found = "missing" if here is None else _impl(here)
                return f"logging.Logger.{r['once']} is {found} here, {r['impl']} when the entry was made"
        for name, question, answer in self.answers:
            logger = logging.getLogger(name)  # "root" is the root logger (Python >= 3.9)
            now = logger.getEffectiveLevel() if question == "effective" else logger.isEnabledFor(question)
            if now != answer:
                return f"logger {name!r} answers {question!r} with {now!r} here, {answer!r} when the entry was made"
        return None

    def emit(self, warnings_issued: int | None = None) -> None:
        """Emit the records that came before the warning numbered ``warnings_issued`` (all that remain: None), and
        make the loader's ``basicConfig()`` where it came among them."""
        while True:
            r = self.records[self._next] if self._next < len(self.records) else None
            if r is not None and warnings_issued is not None and r["after"] > warnings_issued:
                return
            if self._next == self.basic_config:
                self.basic_config = None
                logging.basicConfig()  # nothing where the root logger has a handler: the plain call's made none
            if r is None:
                return
            self._next += 1
            logger = logging.getLogger(r["logger"])
            if "once" in r:  # the cached method emits the record, or not, as the plain call's would
                getattr(logger, r["once"])(*r["args"])
                continue
            record = logger.makeRecord(r["name"], r["level"], r["pathname"], r["lineno"], r["msg"], (), None,
                                       func=r["func"], sinfo=r["stack"])
            record.exc_text = r["exc_text"]
            vars(record).update(r["extra"])
            logger.handle(record)
