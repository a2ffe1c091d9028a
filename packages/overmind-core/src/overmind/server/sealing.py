"""Check that a published fd is a sealed memfd (the seal set of ``shm/seals.py``), so no client can change bytes
others have mapped."""
from __future__ import annotations

import errno
import fcntl
import os

from ..errors import OvermindError
from ..shm import seals


class NotSealed(OvermindError, ValueError):
    """The fd is not a memfd, or lacks one of the required seals (``shm.seals.REQUIRED``)."""


def sealed_size(fd: int) -> int:
    """Return the size in bytes of the sealed memfd ``fd``; raise ``NotSealed`` otherwise."""
    try:
        have = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise NotSealed(
                "the published fd is not a memfd (it does not support seals); publish a memfd created with "
                "os.memfd_create(name, os.MFD_ALLOW_SEALING) and sealed"
            ) from None
        raise
    names = seals.missing(have)
    if names:
        raise NotSealed(
            f"the published memfd lacks {', '.join(names)}; seal it with fcntl(fd, F_ADD_SEALS, "
            f"{seals.REQUIRED_NAMES}) after unmapping every writable mapping"
        )
    return os.fstat(fd).st_size
