"""The server's log: lines appended to ``server.log``, rotated by size (``OVERMIND_LOG_MAX_BYTES``), reopened when
something removes it; not :mod:`logging`, whose import would weigh on a process that lives for hours.

A line reads ``2026-12-03 23:14:05,123 pid 4242 MainThread INFO published ...``. ``OVERMIND_LOG_MAX_BYTES``
(default 16M) is the size at which ``server.log`` becomes ``server.log.1`` (the older ones shift up to
``server.log.3``, the oldest goes). A tmp cleaner that deletes the log, as it may the socket, gets a new file
on the next line. ``--foreground`` also writes each line to stderr. Before :meth:`ServerLog.open`, warnings and
errors go to stderr alone.

Not ``logging``: the server lives for hours beside the users' processes, and ``logging`` alone would be ~1.1 MiB of
the server's ~10 MiB of memory, before its rotating handler (which imports ``pickle`` and ``queue``).
``traceback`` is imported only to log an exception.
"""
from __future__ import annotations

import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_LEVEL_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}
BACKUPS = 3


class ServerLog:
    """The server's one log; module-level :data:`log` is it."""

    def __init__(self) -> None:
        self.level = INFO
        self._lock = threading.Lock()
        self._path: str | None = None
        self._max_bytes = 0
        self._stream: TextIO | None = None
        self._identity: tuple[int, int] | None = None
        self._echo = False

    def open(self, path: str, max_bytes: int, foreground: bool = False) -> None:
        """Write to ``path`` from now on (and to stderr with ``foreground``), rotating at ``max_bytes``."""
        with self._lock:
            self._path, self._max_bytes, self._echo = path, max_bytes, foreground
            self._reopen()

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
            self._stream = self._path = None

    def debug(self, msg: str, *args: Any) -> None:
        self.log(DEBUG, msg, *args)

    def info(self, msg: str, *args: Any) -> None:
        self.log(INFO, msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self.log(WARNING, msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self.log(ERROR, msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        """:meth:`error`, followed by the traceback of the exception being handled."""
        self.log(ERROR, msg, *args, exc_info=True)

    def log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        if level < self.level:
            return
        try:
            text = msg % args if args else msg
        except (TypeError, ValueError) as exc:  # a bad format is the log's bug, never the server's crash
            text = f"{msg!r} % {args!r} ({exc})"
        if exc_info and sys.exc_info()[0] is not None:
            import traceback

            text += "\n" + "".join(traceback.format_exception(*sys.exc_info())).rstrip("\n")
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        line = (f"{stamp} pid {os.getpid()} {threading.current_thread().name} "
                f"{_LEVEL_NAMES.get(level, level)} {text}\n")
        with self._lock:
            if self._path is None:
                if level >= WARNING:
                    _to_stderr(line)
                return
            if self._echo:
                _to_stderr(line)
            try:
                self._write(line)
            except OSError:  # a full disk or a vanished folder: the server goes on without its log line
                pass

    def _write(self, line: str) -> None:
        current = self._stat()
        if self._stream is None or current is None or current != self._identity:
            self._reopen()  # removed or replaced since: a new file, as logging's WatchedFileHandler does
        assert self._stream is not None
        if self._max_bytes > 0 and self._stream.tell() + len(line.encode()) >= self._max_bytes:
            self._rotate()
        self._stream.write(line)
        self._stream.flush()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path)  # type: ignore[arg-type]
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _reopen(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        assert self._path is not None
        self._stream = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 (held open between lines)
        self._identity = self._stat()

    def _rotate(self) -> None:
        """``server.log`` -> ``.1`` -> ``.2`` -> ``.3``; the oldest goes."""
        assert self._stream is not None and self._path is not None
        self._stream.close()
        self._stream = None
        for i in range(BACKUPS - 1, 0, -1):
            older = f"{self._path}.{i}"
            if os.path.exists(older):
                os.replace(older, f"{self._path}.{i + 1}")
        if os.path.exists(self._path):
            os.replace(self._path, f"{self._path}.1")
        self._reopen()


def _to_stderr(line: str) -> None:
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr (detached, closed)
        pass


log = ServerLog()
