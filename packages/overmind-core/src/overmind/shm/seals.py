"""The seals of an entry's memfd, defined once: the writer applies them, the server requires them.

A memfd sealed against writing, growing and shrinking can still be mapped MAP_PRIVATE by every reader, and
nobody (the writer included) can change the bytes others have mapped. The writer also adds F_SEAL_SEAL so the
seals themselves cannot change; the server does not require it (a memfd without it is as immutable).
"""
from __future__ import annotations

import fcntl

REQUIRED = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
APPLIED = REQUIRED | fcntl.F_SEAL_SEAL
_NAMES = (("F_SEAL_WRITE", fcntl.F_SEAL_WRITE), ("F_SEAL_GROW", fcntl.F_SEAL_GROW),
          ("F_SEAL_SHRINK", fcntl.F_SEAL_SHRINK))
REQUIRED_NAMES = "|".join(name for name, _ in _NAMES)


def missing(seals: int) -> list[str]:
    """The names of the required seals that ``seals`` (``fcntl(fd, F_GET_SEALS)``) lacks."""
    return [name for name, bit in _NAMES if not seals & bit]
