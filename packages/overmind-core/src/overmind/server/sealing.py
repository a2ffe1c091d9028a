"""Check that a published fd is a sealed memfd, so no client can change bytes others have mapped."""
from __future__ import annotations

import errno
import fcntl
import os

REQUIRED_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


class NotSealed(ValueError):
    """The fd is not a memfd, or lacks F_SEAL_WRITE|F_SEAL_GROW|F_SEAL_SHRINK."""


def sealed_size(fd: int) -> int:
    """Return the size in bytes of the sealed memfd ``fd``; raise ``NotSealed`` otherwise."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise NotSealed(
                "the published fd is not a memfd (it does not support seals); publish a memfd created with "
                "os.memfd_create(name, os.MFD_ALLOW_SEALING) and sealed"
            ) from None
        raise
    missing = REQUIRED_SEALS & ~seals
    if missing:
        names = [n for n, bit in (("F_SEAL_WRITE", fcntl.F_SEAL_WRITE), ("F_SEAL_GROW", fcntl.F_SEAL_GROW),
                                  ("F_SEAL_SHRINK", fcntl.F_SEAL_SHRINK)) if missing & bit]
        raise NotSealed(
            f"the published memfd lacks {', '.join(names)}; seal it with fcntl(fd, F_ADD_SEALS, "
            f"F_SEAL_WRITE|F_SEAL_GROW|F_SEAL_SHRINK) after unmapping every writable mapping"
        )
    return os.fstat(fd).st_size
