"""A logger that imports :mod:`logging` on its first use.

``overmind.activate()`` logs nothing unless an adapter is skipped, and importing :mod:`logging` (with
:mod:`traceback`, :mod:`string`, :mod:`weakref`) is a tenth of what activation costs a process that has not
imported it. The modules activation imports hold one of these instead of a :class:`logging.Logger`; every
record goes to the same named logger, so handlers, levels and ``caplog`` see no difference.

>>> log = logger("overmind")
>>> log.info("%s", "imports logging now")
"""
from __future__ import annotations

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

    def __repr__(self) -> str:
        return f"<LazyLogger {self.name}>"


def logger(name: str) -> LazyLogger:
    """The logger ``name``, imported on first use."""
    return LazyLogger(name)
