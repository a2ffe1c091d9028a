"""Give the C heap's free memory back to the system after a large rebuild: the temporaries it freed (glibc's
``malloc_trim``).

Rebuilding a large skeleton makes temporaries the result does not keep (a 49k-token tokenizer's vocabulary and
merges pass through Python dicts and lists on their way into the Rust tokenizer). Freed, their memory stays in
glibc's heap, counted in the process's resident set (docs/architecture.md, "Measured costs": how much, and what the
trim takes). :func:`trim` asks glibc (``malloc_trim(0)``) to return it; elsewhere (musl, no ``malloc_trim``) it does
nothing. Freeing is all it does: no object, address or allocation the program holds changes.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

from . import interrupts

TRIM_AFTER_BYTES = 1 << 20  # a skeleton this large rebuilds enough temporaries to be worth one trim


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError) as exc:
        interrupts.raise_users(exc)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return the heap's free memory to the system; whether this C library could."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
