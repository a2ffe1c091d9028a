"""The log records a loader emits: recorded on a miss, kept in the entry, emitted again on a hit.

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

When in doubt, the result is not cached (:attr:`Recording.unsure`): another thread logged while the loader
ran, a record carries an attribute of its own that is not a plain value, or its message could not be made.
Not reproduced: progress bars (they are written to the terminal, not logged), a record a library logs once per
process (transformers' ``warning_once``), which a hit emits again where the plain call would not, and the records
of a ``Logger`` subclass that overrides ``handle`` (the recording sits in ``Logger.handle``).
"""
from __future__ import annotations

import contextlib
import logging

from . import interrupts, recordings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

_saved: dict[str, Any] = {}  # while any recording runs: Logger's own handle, isEnabledFor and getEffectiveLevel
_SCALARS = (str, int, float, bool, type(None))
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_WARNINGS_LOGGER = "py.warnings"  # warnings shown through logging (captureWarnings): a hit replays them as warnings


class Recording(recordings.Recording):
    """The log records of one loader run and the logging answers it saw; :meth:`for_entry` goes into the entry,
    unless :attr:`unsure` says why not. ``warnings_so_far()``: how many warnings the loader has issued, which
    places each record among them."""

    def __init__(self, warnings_so_far: Callable[[], int]) -> None:
        super().__init__()
        self.records: list[dict] = []
        self.answers: dict[tuple, Any] = {}
        self._warnings_so_far = warnings_so_far

    def for_entry(self) -> dict | None:
        if not self.records and not self.answers:
            return None
        return {"records": self.records, "answers": [[n, q, a] for (n, q), a in self.answers.items()]}

    def answered(self, name: str, question: Any, answer: Any) -> None:
        self.answers.setdefault((name, question), answer)

    def note(self, logger: logging.Logger, record: logging.LogRecord) -> None:
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
    if record.name != _WARNINGS_LOGGER and record.name.split(".")[0] != "overmind":  # Overmind's own: not the entry's
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
    return answer


def _get_effective_level(self: logging.Logger) -> int:
    answer = _saved["getEffectiveLevel"](self)
    for rec in _RUNNING.mine():
        rec.answered(self.name, "effective", answer)
    return answer


_PATCHED = {"handle": _handle, "isEnabledFor": _is_enabled_for, "getEffectiveLevel": _get_effective_level}


def _start() -> None:
    for name, replacement in _PATCHED.items():
        _saved[name] = vars(logging.Logger)[name]
        setattr(logging.Logger, name, replacement)


def _stop() -> None:
    for name, replacement in _PATCHED.items():
        if vars(logging.Logger).get(name) is replacement:
            setattr(logging.Logger, name, _saved[name])


_RUNNING: recordings.Running[Recording] = recordings.Running(_start, _stop)


@contextlib.contextmanager
def recording(warnings_so_far: Callable[[], int]) -> Iterator[Recording]:
    """Record the log records handled in this thread inside the block, and the logging answers it gets."""
    with _RUNNING.running(Recording(warnings_so_far)) as rec:
        yield rec


class Replay:
    """An entry's recorded log records. :meth:`differs` is checked before the hit is returned; :meth:`emit` hands
    the records to their loggers between the replayed warnings (``loader_warnings.Replay.issue``)."""

    def __init__(self, kept: dict | None) -> None:
        kept = kept or {}
        self.records: list[dict] = list(kept.get("records") or ())
        self.answers: list = list(kept.get("answers") or ())
        self._next = 0

    def differs(self) -> str | None:
        """The first logging answer this process gives otherwise than the miss's loader got, or ``None``."""
        for name, question, answer in self.answers:
            logger = logging.getLogger(name)  # "root" is the root logger (Python >= 3.9)
            now = logger.getEffectiveLevel() if question == "effective" else logger.isEnabledFor(question)
            if now != answer:
                return f"logger {name!r} answers {question!r} with {now!r} here, {answer!r} when the entry was made"
        return None

    def emit(self, warnings_issued: int | None = None) -> None:
        """Emit the records that came before the warning numbered ``warnings_issued`` (all that remain: None)."""
        while self._next < len(self.records):
            r = self.records[self._next]
            if warnings_issued is not None and r["after"] > warnings_issued:
                return
            self._next += 1
            logger = logging.getLogger(r["logger"])
            record = logger.makeRecord(r["name"], r["level"], r["pathname"], r["lineno"], r["msg"], (), None,
                                       func=r["func"], sinfo=r["stack"])
            record.exc_text = r["exc_text"]
            vars(record).update(r["extra"])
            logger.handle(record)
