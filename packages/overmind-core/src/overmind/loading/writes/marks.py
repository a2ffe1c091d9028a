"""Marks of dicts: ``(version, length, digest of the items' identities)`` for each of a list of dicts, taken before
and after a loader runs, so that the dicts it changed, and whether a changed one only gained items at its end, are
found without copying them (``csrc/dict_marks.cpp``, or its Python twin).

A digest covers every item's key, value and value type by identity, in the dict's order; a dict that only gained
items at its end keeps the digest of its first ``length`` items (:func:`prefix_digest`), so the items it gained are
the ones after them. The compiled marks (``csrc/dict_marks.cpp``) skip the digest of a dict whose interpreter
version tag has not moved since the ``previous`` marks, and so does the Python twin where ctypes can read the tag.
Both give the same answers to :func:`changed` and :func:`appended`; their digests are not comparable with each
other.
"""
from __future__ import annotations

import itertools
import struct
import sys
from typing import Any

from ...native import zerocopy

MARK = struct.Struct("<QQQ")
_MASK = (1 << 64) - 1


def _py_digest(d: dict, n: int) -> int:
    keys = tuple(itertools.islice(map(id, dict.keys(d)), n))
    values = tuple(itertools.islice(dict.values(d), n))
    return hash((keys, tuple(map(id, values)), tuple(map(id, map(type, values))), len(keys))) & _MASK


def _version_reader() -> Any:
    """A dict's version tag read through ctypes, where the interpreter keeps one at the compiled twin's offset
    (CPython 3.10-3.13 with the GIL: after the object header and ``ma_used``); else None."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 14) or not getattr(sys, "_is_gil_enabled",
                                                                                            lambda: True)():
        return None
    import ctypes

    at = ctypes.c_uint64.from_address
    return lambda d: at(id(d) + 24).value


_read_version = _version_reader()


def _py_marks(dicts: list[dict], previous: bytes | None) -> bytes:
    out = bytearray(len(dicts) * MARK.size)
    for i, d in enumerate(dicts):
        version = _read_version(d) if _read_version is not None else 0
        digest = None
        if version and previous is not None and (i + 1) * MARK.size <= len(previous):
            before = MARK.unpack_from(previous, i * MARK.size)
            if before[0] == version:
                digest = before[2]
        MARK.pack_into(out, i * MARK.size, version, len(d), _py_digest(d, len(d)) if digest is None else digest)
    return bytes(out)


_PYTHON = (_py_marks, _py_digest)


def implementation() -> tuple[Any, Any]:
    """``(marks, prefix_digest)`` of the active implementation (marks of one are not compared with the other's)."""
    ext = zerocopy.dict_marks()
    return ext if ext is not None else _PYTHON


def marks(dicts: list[dict], previous: bytes | None = None) -> bytes:
    """The marks of ``dicts`` (24 bytes each); ``previous``: marks of the same list taken earlier, whose digests
    serve where a dict's version tag has not moved."""
    return implementation()[0](dicts, previous)


def prefix_digest(d: dict, n: int) -> int:
    """The digest :func:`marks` gives ``d`` holding only its first ``n`` items."""
    return implementation()[1](d, n)


def _table(at: bytes) -> Any:
    import numpy  # torch's own dependency: there whenever a loader runs

    return numpy.frombuffer(at, dtype="<u8").reshape(-1, 3)


def versions(at: bytes) -> Any:
    """The version tags of marks ``at`` (0 where the interpreter keeps none), as an array."""
    return _table(at)[:, 0].copy()


def moved(before: Any, after: Any, indexes: list[int]) -> list[int]:
    """Those of ``indexes`` whose version tag differs between two :func:`versions` of one list, or is 0 (unknown)."""
    import numpy

    flags = (before != after) | (after == 0)
    if not flags.any():
        return []
    wanted = numpy.zeros(len(after), dtype=bool)
    wanted[indexes] = True
    return numpy.nonzero(flags & wanted)[0].tolist()


def changed(before: bytes, after: bytes) -> list[int]:
    """Indexes of the dicts whose length or digest differs between two marks of one list."""
    import numpy

    if before == after:
        return []
    b, a = _table(before), _table(after)
    return numpy.nonzero((b[:, 1] != a[:, 1]) | (b[:, 2] != a[:, 2]))[0].tolist()


def appended(d: dict, before: bytes, index: int) -> int | None:
    """How many items ``d`` (the dict at ``index`` of ``before``'s list) gained at its end, having kept all it held;
    None where it lost or replaced any of them."""
    _version, length, digest = MARK.unpack_from(before, index * MARK.size)
    if len(d) < length or prefix_digest(d, length) != digest:
        return None
    return len(d) - length
