"""The server's log file: rotated by size, and reopened when something removes it.

``OVERMIND_LOG_MAX_BYTES`` (default 16M) is the size at which ``server.log`` becomes ``server.log.1`` (the
older ones shift up to ``server.log.3``, the oldest goes). A tmp cleaner that deletes the log, as it may the
socket, gets a new file on the next line, as ``logging.handlers.WatchedFileHandler`` does.
"""
from __future__ import annotations

import logging
import logging.handlers
import os

BACKUPS = 3


class ServerLogHandler(logging.handlers.RotatingFileHandler):
    """``RotatingFileHandler`` that also reopens its file when it was removed or replaced."""

    def __init__(self, path: str, max_bytes: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=BACKUPS, delay=False)
        self._identity = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.baseFilename)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def emit(self, record: logging.LogRecord) -> None:
        current = self._stat()
        if current is None or current != self._identity:
            if self.stream is not None:
                self.stream.close()
            self.stream = self._open()
            self._identity = self._stat()
        super().emit(record)

    def doRollover(self) -> None:
        super().doRollover()
        self._identity = self._stat()
