"""Moving one entry between a node and the store: :func:`upload` from the entry's fds, :func:`download` into
new sealed memfds.

>>> sent = upload(store, key, pkey, stack, "e1", meta, entry_fd, [("e0", dep_fd, "entry")])
>>> got = download(store, key, pkey, stack)     # None: no entry for pkey in the store
>>> got.main                                    # ("e1", fd of a sealed memfd holding the same bytes)

The upload writes each blob the store lacks, then the signed manifest, last: until the manifest is there no
node finds the entry, so an upload killed half-way leaves nothing importable, and two nodes uploading the same
entry write the same blobs and each a valid manifest. The download verifies the manifest before it reads a
blob, and every blob's size and sha256 before it hands out an fd: nothing unpickles bytes the fleet key did not
vouch for. Its memfds are sparse where a blob has all-zero 64 KiB runs (they are never written), and sealed as
the server requires of an entry (:data:`overmind.shm.seals.APPLIED`).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from typing import Any, Callable, NamedTuple

from ..shm import seals
from . import extents
from .errors import NotInStore, Refused
from .manifest import BlobRef, blobs, build, sign, verify
from .stores import Store

_CHUNK = 1 << 20


class Imported(NamedTuple):
    """A downloaded entry: its verified manifest, ``main`` = ``(entry_id, fd)`` and ``deps`` = ``[(entry_id,
    fd, kind), ...]``, each fd a sealed memfd the caller owns (:meth:`close` closes them all)."""

    manifest: dict[str, Any]
    main: tuple[str, int]
    deps: list[tuple[str, int, str]]

    def close(self) -> None:
        for fd in [self.main[1], *(d[1] for d in self.deps)]:
            os.close(fd)


def digest_of(fd: int) -> tuple[str, int]:
    """``(sha256 hex, size)`` of the whole content of ``fd`` (read with ``pread``)."""
    size = os.fstat(fd).st_size
    h = hashlib.sha256()
    pos = 0
    while pos < size:
        data = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not data:
            break
        h.update(data)
        pos += len(data)
    return h.hexdigest(), pos


def upload(store: Store, key: bytes, portable_key: str, stack: dict[str, Any], entry_id: str,
           meta: dict[str, Any], main_fd: int, deps: list[tuple[str, int, str]]) -> int:
    """Put one entry in ``store`` under ``portable_key``: its blobs the store lacks, then its manifest signed
    with ``key``. Returns the bytes of blob uploaded (0 when the store had them all). Raises
    :class:`~overmind.fleet.errors.StoreError` when the store fails; nothing is then importable.

    An entry this node imported (its meta's ``fleet_ids``, ``server/imports.py``) names its dependencies
    by the ids its skeleton holds, its publisher's, not by this node's parts."""
    if "fleet_ids" in meta:
        skeleton_ids = {part: foreign for foreign, part in meta["fleet_ids"].items()}
        deps = [(skeleton_ids.get(eid, eid), fd, kind) for eid, fd, kind in deps]
        meta = {k: v for k, v in meta.items() if k != "fleet_ids"}
    items = [(entry_id, main_fd, "entry"), *deps]
    refs: list[BlobRef] = []
    sent = 0
    for eid, fd, kind in items:
        span = os.fstat(fd).st_size
        runs = extents.data_extents(fd, span)
        size = sum(length for _, length in runs)
        digest = extents.packed_digest(fd, runs)
        dense = runs == [(0, span)] or not span
        refs.append(BlobRef(eid, digest, size, kind, None if dense else span,
                            None if dense else [list(run) for run in runs]))
        if any(r.digest == digest for r in refs[:-1]) or store.has_blob(digest):
            continue
        store.put_blob(digest, extents.ExtentReader(fd, runs), size)  # type: ignore[arg-type]
        sent += size
    store.put_ref(portable_key, sign(build(portable_key, stack, entry_id, meta, refs[0], refs[1:]), key))
    return sent


LOCAL = "local"  # the kind of a dependency served by a file of this machine (download's ``local``)


def download(store: Store, key: bytes, portable_key: str, stack: dict[str, Any],
             local: Callable[[str], int | None] | None = None) -> Imported | None:
    """The entry stored under ``portable_key``, verified, in sealed memfds; None when the store has none.
    Raises :class:`~overmind.fleet.errors.Refused` (an entry not to import: bad signature, foreign, a blob
    damaged, cut short or missing) or :class:`~overmind.fleet.errors.StoreError`; no fd is left open then.

    ``local(sha256)``: a read-only fd of a file of this machine known to hold those bytes, or None. A
    checkpoint file the entry references that this node holds too (the same bytes the portable key was
    made of) is not downloaded: its dependency comes back as kind :data:`LOCAL` with that file's fd."""
    data = store.get_ref(portable_key)
    if data is None:
        return None
    manifest = verify(data, key, portable_key, stack)
    main, deps = blobs(manifest)
    fds: dict[str, int] = {}  # digest -> the fd that holds it; a blob named twice is fetched once
    kinds: list[str] = []
    handed: list[int] = []
    try:
        for ref in [main, *deps]:
            if ref.digest not in fds:
                here = _local_file(local, ref)
                fds[ref.digest] = here if here is not None else _fetch(store, ref, portable_key)
                handed.append(fds[ref.digest])
                kinds.append(LOCAL if here is not None else ref.kind)
            else:
                handed.append(os.dup(fds[ref.digest]))
                kinds.append(kinds[[r.digest for r in [main, *deps]].index(ref.digest)])
    except BaseException:
        for fd in handed:
            os.close(fd)
        raise
    return Imported(manifest, (main.entry_id, handed[0]),
                    [(d.entry_id, fd, kind) for d, fd, kind in zip(deps, handed[1:], kinds[1:])])


def _local_file(local: Callable[[str], int | None] | None, ref: BlobRef) -> int | None:
    """This machine's file holding ``ref``'s bytes (a checkpoint file only), of its size, or None."""
    if local is None or ref.kind != "file":
        return None
    fd = local(ref.digest)
    if fd is not None and (ref.extents is not None or os.fstat(fd).st_size != ref.size):
        os.close(fd)
        return None
    return fd


def _fetch(store: Store, ref: BlobRef, portable_key: str) -> int:
    """A sealed memfd holding blob ``ref``, checked against its size and digest."""
    fd = os.memfd_create(f"overmind-fleet-{ref.digest[:16]}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, ref.size if ref.span is None else ref.span)
        try:
            stream = store.open_blob(ref.digest)
        except NotInStore:
            raise Refused("missing", f"the fleet entry {portable_key} names blob {ref.digest}, which is not in "
                                     f"{store.url}; the store was pruned by hand. Loading without it.") from None
        with stream:
            runs = [(0, ref.size)] if ref.extents is None else [(o, n) for o, n in ref.extents]
            got, digest = extents.write_extents(stream, fd, runs, ref.size)
        if got != ref.size:
            raise Refused("truncated", f"blob {ref.digest} of fleet entry {portable_key} in {store.url} has "
                                       f"{'more than ' if got > ref.size else ''}{got} bytes, not {ref.size}; "
                                       "it was damaged in the store. Loading without it.")
        if digest != ref.digest:
            raise Refused("digest", f"blob {ref.digest} of fleet entry {portable_key} in {store.url} has other "
                                    f"bytes (sha256 {digest}); it was damaged or tampered with in the store. "
                                    "Loading without it.")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals.APPLIED)
        return fd
    except BaseException:
        os.close(fd)
        raise
