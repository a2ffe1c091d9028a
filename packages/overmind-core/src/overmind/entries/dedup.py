"""Identical bytes stored once: after pickling, a new entry's storages whose bytes an entry already holds (a sampled
key, then a byte compare) are referenced there instead of written, and the redirect table a rebuild reads says where
(``OVERMIND_DEDUP``).

One model loaded by two loaders (``SentenceTransformer(path)`` and ``AutoModel.from_pretrained(path)``), an fp32
checkpoint converted to fp16 by two pipelines, the untouched layers of a model and of its LoRA-merged twin: the
pickled storages of the second entry hold bytes an earlier entry already holds. :func:`plan` runs after pickling,
before anything is written:

1. every CPU storage of at least :data:`MIN_BYTES` gets a *blob key*: its size and a SHA-256 of :data:`SAMPLES`
   chunks of :data:`CHUNK` bytes spread over it (first and last included). A key is only a hint of where equal bytes
   may be, so it need not cover every byte: a full hash would cost every cold load a pass over all its bytes, found
   or not (docs/architecture.md, "Identical bytes stored once"), while the sampled one costs next to nothing per
   storage and the compare below is what decides;
2. one ``blobs`` request asks the server which entries hold bytes of those keys (:mod:`.server.blobs`; it sends
   each such entry's fd);
3. each candidate is **compared byte for byte** with the storage (``memcmp`` over a fresh private mapping of the
   holder, faster than writing the bytes would be: docs/architecture.md, "Measured costs"; bytes that differ usually
   differ in the first cache line). Equal bytes, and only those, become a *redirect*: the storage is not written
   (the memfd keeps a hole there, which tmpfs backs with no page) and the entry that holds the bytes becomes a
   dependency of the new one (so it lives as long as the new entry does). Two storages of one entry with equal bytes
   share the first one's bytes the same way.

The redirect table travels in the entry's meta (``meta["dedup"]``); :class:`Redirects` answers a rebuild's
storages from it, through mappings of the holders made for this rebuild: one per holder, and one more for each
further storage sharing the same bytes. Copy-on-write is per mapping, so two storages that were distinct in the
plain result stay distinct (a write to one never shows in the other), and a rebuilt object never shares a
mapping with another object built from the holder. The blob keys of the
storages an entry really holds go to the server with the publish (``meta["blobs"]``, moved into the index).
``OVERMIND_DEDUP=0`` turns it off.

>>> shared = plan(pickled.storages)                  # the storages to write, deps, meta, and what it cost
>>> writer.write_entry(skeleton, shared.written, data_len)
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .. import settings
from .._util import interrupts
from ..errors import OvermindError
from ..shm.layout import STORAGE_ALIGN

if TYPE_CHECKING:
    import torch

    from ..shm.reader import EntryMapping

log = logging.getLogger("overmind")

MIN_BYTES = 64 << 10  # smaller storages are written: a hole saves whole pages only, and a redirect costs a row
CHUNK = 4096
SAMPLES = 16
_SELF = -1  # a redirect target index meaning "this entry"
_BATCH = 8192  # keys per blobs request (server.blobs.MAX_KEYS)
# At most this many storages (the largest) are keyed: the publish's blob list and redirect table ride in a
# request of at most 1 MiB (server/limits.py), and a result with more large storages is rare.
MAX_KEYED = 4096


def blob_key(address: int, nbytes: int) -> str:
    """``"<nbytes>:<hex>"``: the size and a SHA-256 of sampled chunks of ``nbytes`` bytes at ``address``."""
    view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    h = hashlib.sha256()
    if nbytes <= SAMPLES * CHUNK:
        h.update(view)
    else:
        step = (nbytes - CHUNK) / (SAMPLES - 1)
        for i in range(SAMPLES):
            lo = int(i * step)
            h.update(view[lo:lo + CHUNK])
    return f"{nbytes}:{h.hexdigest()[:32]}"


_memcmp = ctypes.CDLL(None).memcmp
_memcmp.restype = ctypes.c_int
_memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def same_bytes(a: int, b: int, nbytes: int) -> bool:
    """Whether ``nbytes`` at addresses ``a`` and ``b`` are equal (``memcmp``; ctypes releases the GIL)."""
    return a == b or _memcmp(a, b, nbytes) == 0


@dataclass
class Plan:
    """What :func:`plan` decided: the storages to write, the entries now referenced, the entry meta to add."""

    written: list[tuple[Any, int]]  # (storage, offset in the data region), as Pickled.storages
    deps: set[str] = field(default_factory=set)
    meta: dict[str, Any] = field(default_factory=dict)
    # What it cost and found (logged; benchmarks read it): bytes keyed, compared and not written, and seconds
    # in all, keying and comparing.
    keyed: int = 0
    compared: int = 0
    saved: int = 0
    seconds: float = 0.0
    key_seconds: float = 0.0
    compare_seconds: float = 0.0


def enabled() -> bool:
    return settings.current().dedup


def plan(storages: list[tuple[torch.UntypedStorage, int]],
         lookup: Callable[[list[str]], tuple[list, dict[str, int]]] | None = None) -> Plan:
    """Which of a new entry's ``storages`` (``Pickled.storages``) hold bytes an entry already holds.

    ``lookup(keys) -> (found, fds)`` is the server's ``blobs`` request (default: this process's client); if it
    fails, every storage is written. Never raises for what the server says: a candidate that is not there,
    out of range or different is simply not used.
    """
    t0 = time.perf_counter()
    if not enabled():
        return Plan(list(storages))
    out = _Planner(storages)
    try:
        out.run(lookup or _server_lookup)
    finally:
        out.result.seconds = time.perf_counter() - t0
    r = out.result
    if r.keyed:
        log.debug("dedup keyed %d bytes, compared %d, found %d already held, in %.3f s", r.keyed,
                  r.compared, r.saved, r.seconds)
    return r


def _server_lookup(keys: list[str]) -> tuple[list, dict[str, int]]:
    from ..client.connection import get_client

    return get_client().blobs(keys)


class _Planner:
    def __init__(self, storages: list[tuple[Any, int]]) -> None:
        self.storages = list(storages)
        self.result = Plan([])

    def run(self, lookup: Callable[[list[str]], tuple[list, dict[str, int]]]) -> None:
        t0 = time.perf_counter()
        worth = [(s, o, s.nbytes()) for s, o in self.storages if s.device.type == "cpu" and s.nbytes() >= MIN_BYTES]
        if len(worth) > MAX_KEYED:
            worth = sorted(sorted(worth, key=lambda w: -w[2])[:MAX_KEYED], key=lambda w: w[1])
        # (storage, offset, address, nbytes, key) of each storage worth keying.
        keyed = []
        for storage, offset, n in worth:
            address = storage.data_ptr()
            keyed.append((storage, offset, address, n, blob_key(address, n)))
            self.result.keyed += n
        self.result.key_seconds = time.perf_counter() - t0
        if not keyed:
            self.result.written = self.storages
            return
        keys = list(dict.fromkeys(k[4] for k in keyed))
        candidates, fds = self._ask(lookup, keys)
        t1 = time.perf_counter()
        try:
            redirects = self._match(keyed, keys, candidates, fds)
        finally:
            self.result.compare_seconds = time.perf_counter() - t1
            for fd in fds.values():
                with interrupts.suppress(OSError):
                    os.close(fd)
        self._finish(keyed, redirects)

    def _ask(self, lookup, keys: list[str]) -> tuple[dict[str, list[tuple[str, int]]], dict[str, int]]:
        """Candidates by key, ``[(entry_id, offset)]``, and the fds of their entries."""
        candidates: dict[str, list[tuple[str, int]]] = {}
        fds: dict[str, int] = {}
        try:
            for lo in range(0, len(keys), _BATCH):
                batch = keys[lo:lo + _BATCH]
                found, got = lookup(batch)
                for eid, fd in got.items():
                    if eid in fds:
                        os.close(fd)
                    else:
                        fds[eid] = fd
                for item in found:
                    i, eid, offset = item
                    if isinstance(i, int) and 0 <= i < len(batch) and eid in fds and isinstance(offset, int):
                        candidates.setdefault(batch[i], []).append((eid, offset))
        except Exception as exc:  # noqa: BLE001 - no dedup is always a correct answer
            interrupts.raise_users(exc)
            log.debug("dedup lookup failed (%s: %s); every storage is written", type(exc).__name__, exc)
        return candidates, fds

    def _match(self, keyed, keys, candidates, fds) -> dict[int, tuple[str | None, int]]:
        """Local offset -> (entry_id or None for this entry, offset there) for each storage found elsewhere."""
        redirects: dict[int, tuple[str | None, int]] = {}
        views = _Views(fds)
        try:
            # Per key, the distinct contents met so far: (address, where, offset) of the bytes to share.
            seen: dict[str, list[tuple[int, str | None, int]]] = {}
            for _storage, offset, address, n, key in keyed:
                reps = seen.setdefault(key, [])
                place = None
                for rep_address, where, rep_offset in reps:
                    if rep_offset % STORAGE_ALIGN != offset % STORAGE_ALIGN:
                        continue  # shared bytes keep this storage's alignment (see shm/placer.py), or are written
                    self.result.compared += n
                    if same_bytes(address, rep_address, n):
                        place = (where, rep_offset)
                        break
                if place is None and not reps:
                    for eid, there in candidates.get(key, ()):
                        if there % STORAGE_ALIGN != offset % STORAGE_ALIGN:
                            continue
                        target = views.address(eid, there, n)
                        if target is None:
                            continue
                        self.result.compared += n
                        if same_bytes(address, target, n):
                            place = (eid, there)
                            reps.append((target, eid, there))
                            break
                if place is None:
                    reps.append((address, None, offset))  # written here: later equal storages share it
                else:
                    redirects[offset] = place
        finally:
            views.close()
        return redirects

    def _finish(self, keyed, redirects: dict[int, tuple[str | None, int]]) -> None:
        r = self.result
        r.written = [(s, o) for s, o in self.storages if o not in redirects]
        r.meta["blobs"] = [[key, offset] for _s, offset, _a, _n, key in keyed if offset not in redirects]
        if not redirects:
            return
        sizes = {offset: n for _s, offset, _a, n, _k in keyed}
        targets: list[str] = []
        index: dict[str, int] = {}
        uses: dict[tuple[str | None, int], int] = {}
        rows = []
        for local, (where, there) in sorted(redirects.items()):
            if where is None:
                t = _SELF
            else:
                t = index.get(where, -2)
                if t == -2:
                    t = index[where] = len(targets)
                    targets.append(where)
                r.deps.add(where)
            copy = uses.get((where, there), 0)
            uses[(where, there)] = copy + 1
            rows.append([local, sizes[local], t, there, copy])
            r.saved += sizes[local]
        r.meta["dedup"] = {"entries": targets, "redirects": rows}


class _Views:
    """Read-only looks at candidate entries' data regions, each mapped once, for the compares."""

    def __init__(self, fds: dict[str, int]) -> None:
        self.fds = fds
        self.maps: dict[str, tuple[mmap.mmap, int, int] | None] = {}

    def address(self, entry_id: str, offset: int, nbytes: int) -> int | None:
        """The address of ``nbytes`` at ``offset`` of ``entry_id``'s data region, or None if not there."""
        if entry_id not in self.maps:
            self.maps[entry_id] = self._map(entry_id)
        got = self.maps[entry_id]
        if got is None:
            return None
        _mm, data_address, data_len = got
        if offset < 0 or offset + nbytes > data_len:
            return None
        return data_address + offset

    def _map(self, entry_id: str):
        from ..shm.layout import Layout, LayoutError

        fd = self.fds.get(entry_id)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # private: never writes the entry
            layout = Layout.unpack(mm, size)
        except (OSError, ValueError, LayoutError) as exc:
            interrupts.raise_users(exc)
            return None
        probe = ctypes.c_char.from_buffer(mm)
        address = ctypes.addressof(probe)
        del probe  # the address stays valid until mm.close(), which an exported buffer would refuse
        return mm, address + layout.data_offset, layout.data_len

    def close(self) -> None:
        for got in self.maps.values():
            if got is not None:
                got[0].close()
        self.maps.clear()


class RedirectError(OvermindError, ValueError):
    """An entry's redirect table does not fit the entry (a storage of another size, a target not sent)."""


class Redirects:
    """A rebuild's view of an entry's redirect table: the storages found in other entries (or elsewhere in this
    one) at the time it was written, each answered from a mapping of its own (see the module docstring)."""

    def __init__(self, entry: dict[str, Any], fds: dict[str, int]) -> None:
        table = ((entry.get("meta") or {}).get("dedup") or {})
        self._rows: dict[int, tuple[int, EntryMapping, int]] = {}
        rows = table.get("redirects") or ()
        if not rows:
            return
        from ..shm.reader import EntryMapping

        fleet_ids = (entry.get("meta") or {}).get("fleet_ids") or {}  # an import's (server/imports.py)
        targets = [fleet_ids.get(t, t) for t in table.get("entries") or ()]
        own = entry["entry_id"]
        mapped: dict[tuple[str, int], EntryMapping] = {}
        for local, nbytes, t, there, copy in rows:
            eid = own if t == _SELF else targets[t]
            if eid not in fds:
                raise RedirectError(f"entry {own} shares bytes of entry {eid}, whose fd the server did not send")
            m = mapped.get((eid, copy))
            if m is None:
                m = mapped[(eid, copy)] = EntryMapping(eid, fds[eid])
            self._rows[local] = (nbytes, m, there)

    def __bool__(self) -> bool:
        return bool(self._rows)

    def wrap(self, source: Callable[[Any, int, int], torch.UntypedStorage]
             ) -> Callable[[Any, int, int], torch.UntypedStorage]:
        """``source`` (``storage_source(where, offset, nbytes)`` of a rebuild), answering redirected storages."""
        if not self._rows:
            return source
        rows = self._rows

        def redirected(where: Any, offset: int, nbytes: int) -> torch.UntypedStorage:
            row = rows.get(offset) if where is None else None
            if row is None:
                return source(where, offset, nbytes)
            size, mapping, there = row
            if size != nbytes:
                raise RedirectError(f"storage at {offset} is {nbytes} bytes, its redirect {size}")
            return mapping.storage(there, nbytes)

        return redirected

