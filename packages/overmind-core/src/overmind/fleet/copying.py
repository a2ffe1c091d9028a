"""One store's entries copied into another, verified on the way (``overmind import``): an entry is
copied only when its manifest is signed with the fleet key for this node's stack and every blob it
names hashes to its digest; its blobs go first, its reference last, so a copy cut short leaves
nothing importable.
"""
from __future__ import annotations

import hashlib
from typing import Any

from .errors import Refused
from .manifest import blobs, verify
from .stores import Store

_CHUNK = 8 << 20


def copy_entry(source: Store, target: Store, key: bytes, portable_key: str,
               stack: dict[str, Any]) -> int:
    """Copy the entry ``portable_key`` of ``source`` into ``target``; the blob bytes copied. Raises
    :class:`~overmind.fleet.errors.Refused` (nothing copied) for an entry this node would refuse to
    import, and ``StoreError`` for a store that fails."""
    data = source.get_ref(portable_key)
    if data is None:
        raise Refused("missing", f"the layout names {portable_key} but holds no reference for it")
    main, deps = blobs(verify(data, key, portable_key, stack))
    wanted = {ref.digest: ref for ref in [main, *deps] if not target.has_blob(ref.digest)}
    for ref in wanted.values():
        _check(source, ref.digest, ref.size, portable_key)
    copied = 0
    for ref in wanted.values():
        with source.open_blob(ref.digest) as stream:
            target.put_blob(ref.digest, stream, ref.size)
        copied += ref.size
    target.put_ref(portable_key, data)
    return copied


def _check(store: Store, digest: str, size: int, portable_key: str) -> None:
    h, seen = hashlib.sha256(), 0
    with store.open_blob(digest) as stream:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            seen += len(chunk)
    if seen != size:
        raise Refused("truncated", f"blob {digest} of entry {portable_key} is {seen} bytes, its "
                                   f"manifest says {size}; the entry is not copied")
    if h.hexdigest() != digest:
        raise Refused("digest", f"blob {digest} of entry {portable_key} does not hash to its name; "
                                f"the entry is not copied")
