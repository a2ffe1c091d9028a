"""A logger that imports :mod:`logging` on its first use, for the modules ``activate()`` imports.

``overmind.activate()`` logs nothing unless an adapter is skipped, and importing :mod:`logging` (with
:mod:`traceback`, :mod:`string`, :mod:`weakref`) is a tenth of what activation costs a process that has not
imported it. The modules activation imports hold one of these instead of a :class:`logging.Logger`; every
record goes to the same named logger, so handlers, levels and ``caplog`` see no difference.

A DEBUG or INFO record in a process that has not imported :mod:`logging` is dropped without importing it: no
handler or level can exist there yet, and the logger it would reach has the root logger's default level,
WARNING, so :mod:`logging` would drop it too (a skipped adapter's INFO line, in a program that logs nothing).

>>> log = logger("overmind")
>>> log.info("%s", "imports logging now")
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class LazyLogger:
    """Stands for ``logging.getLogger(name)``: each attribute is the real logger's."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        import logging

        return getattr(logging.getLogger(self.name), attr)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self.__getattr__("debug")(msg, *args, **kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self.__getattr__("info")(msg, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<LazyLogger {self.name}>"


def logger(name: str) -> LazyLogger:
    """The logger ``name``, imported on first use."""
    return LazyLogger(name)
