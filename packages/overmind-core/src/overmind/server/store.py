"""The server's state: published entries by key and id, the budget, and the answers to get,
publish and evict. Who loads which key now is :mod:`.claims`; which entries an eviction takes is
:mod:`.eviction`'s plan, carried out here.

The server runs in one thread, so nothing here locks and nothing blocks: a ``get`` that finds another
owner's claim answers ``busy`` at once, and the server parks the request itself; ``take_changed`` names the
keys whose claim went away or that were published since it was last called, so the server knows which
parked requests to ask again. Nothing here touches sockets: the connection handler passes an opaque
``owner`` (its connection id) and gets back plain data and duplicated fds it must close after sending.

Fds handed out are ``os.dup``s, so an eviction before the reply is sent cannot close an fd in flight;
evicting an entry only closes the server's own fd, and mappings clients already made keep the memory
alive. Entry ids carry a random nonce of this server, so an id seen from an earlier server is unknown here
(never another entry of the same name). An entry marked bad (a client could not rebuild it) is no longer
served under its key; it stays, for the entries that reference it, until the last of them goes.

File entries stand for a checkpoint file whose pages an entry's storages reference instead of
copying them: keyless, with the read-only fd the publisher sent, id ``file-<digest of its identity>``
(``protocol.file_entry_id``). The server checks the fd against the identity the client describes before it
takes it, keeps a file entry exactly as long as an entry references it, and counts its bytes apart (page
cache, not the memfd budget). Before every hit it fstats each file the entry transitively references: one that
changed (size, mtime or ctime: a rewrite in place, a rename over it, an unlink) takes every entry depending on
it out of service, and the get answers as for a missing key.
"""
from __future__ import annotations

import itertools
import os
import stat
import time

from ..errors import OvermindError
from ..ipc.protocol import FILE_IDENTITY_FIELDS, file_entry_id, file_identity, is_file_entry
from . import admission, blobs, claims, eviction, imports, marks, sealing
from .claims import process_owner
from .entry import Entry
from .log import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable



class StoreError(OvermindError):
    """A request the store refuses; ``reason`` is the short code sent to the client."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class GetOutcome:
    """What ``Store.get`` decided; ``fds`` (duplicates, owned by the caller) go with ``fd_entries``."""

    __slots__ = ("status", "entry", "fd_entries", "fds")

    def __init__(self, status: str, entry: dict[str, Any] | None = None, fd_entries: list[str] | None = None,
                 fds: list[int] | None = None) -> None:
        self.status, self.entry = status, entry
        self.fd_entries = [] if fd_entries is None else fd_entries
        self.fds = [] if fds is None else fds


class Store:
    """Entries by key and id, claims by key, and the byte budget."""

    def __init__(self, max_bytes: int,
                 order: eviction.Order = eviction.LEAST_RECENTLY_USED) -> None:
        self.max_bytes = max_bytes
        self.order = order  # which entries go first when a publish needs room (server/eviction.py)
        self._by_key: dict[str, Entry] = {}
        self._by_id: dict[str, Entry] = {}
        self.claims = claims.Claims()  # who loads each key now (server/claims.py)
        self._used = 0
        self._nonce = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)
        self.blobs = blobs.BlobIndex()  # bytes the entries hold, for a publisher's dedup (overmind.entries.dedup)
        self.refusals = admission.Refusals()  # keys whose entry is larger than the whole budget
        self.marks = marks.Marks()  # keys loaded once and not published (server/marks.py)
        # For 'overmind status': gets answered, hits among them, bytes those hits mapped (with their deps),
        # entries published, entries evicted (budget or request).
        self.counters = {"gets": 0, "hits": 0, "bytes_served": 0, "publishes": 0, "evictions": 0,
                         "fleet_imports": 0}
        # called with each published entry and the entries it depends on (server/uploads.py)
        self.on_publish: Callable[[Entry, list[Entry]], None] | None = None

    # ---- get / claim / release -------------------------------------------------------------------------
    def get(self, key: str, owner: int, *, claim: bool, counted: bool = True) -> GetOutcome:
        """Hit, claim or miss per the protocol's ``get``; ``busy`` while another owner holds the claim.
        ``counted=False``: a hit is no use of the entry (hits, eviction order, counters unchanged)."""
        entry = self._by_key.get(key)
        if counted:
            self.counters["gets"] += 1
        if entry is not None and self._retire_changed(self._closure([entry.entry_id])):
            entry = None  # a checkpoint file it references changed: answered as for a missing key
        if entry is not None:
            out = self._hit(entry)
            if counted:
                self._touch(entry)
                entry.hits += 1
                self.counters["hits"] += 1
                self.counters["bytes_served"] += sum(self._by_id[i].nbytes for i in out.fd_entries)
            return out
        refused = self.refusals.under(key, self.max_bytes)
        if refused is not None:  # larger than the whole budget: the caller loads it plainly, without a claim
            return GetOutcome("refused", refused)
        holder = self.claims.holder(key)
        if holder is not None and holder != owner:
            if claim:
                self.claims.want(key)
            return GetOutcome("busy")
        # The same connection asking again is a nested load of the key it is already loading; making it
        # wait for itself would deadlock, so it keeps its claim.
        if not claim:
            return GetOutcome("miss")
        self.claims.claim(key, owner)
        # the room an entry may take (the budget less what no eviction may free): a publisher whose result is
        # larger asks admission before it pickles (server/admission.py); ``first``: no load of the key left a
        # mark in this server's life, so its loader publishes only if it is reused meanwhile (first_done)
        room = self.max_bytes - self._pinned_bytes(set())
        return GetOutcome("claimed", {"room": room, "first": key not in self.marks})

    def first_done(self, key: str, owner: int, nbytes: int, loader: str = "", summary: str = "") -> bool:
        """A first load of ``key`` under ``owner``'s claim ran: whether it publishes. It does when another owner
        asked for the key meanwhile (that waiter then hits), and keeps its claim; otherwise the key is marked
        (``nbytes``: its entry's estimated size) and the claim released, so the next load publishes."""
        if self.claims.holder(key) != owner:
            raise StoreError("no claim", f"first_done refused: this connection holds no claim on {key[:12]}; "
                                         f"load the key again")
        if self.claims.wanted(key):
            return True
        self.marks.note(key, nbytes, loader, summary)
        self.release(key, owner)
        return False

    def hold_for_process(self, key: str, pid: int) -> None:
        """Claim ``key`` for process ``pid`` before it has a connection (the spawner's claim, ``handoff.py``).
        It counts as a get that missed: that process asked for ``key`` by starting the server."""
        self.counters["gets"] += 1
        self.claims.claim(key, process_owner(pid))

    def adopt(self, key: str, owner: int, pid: int) -> None:
        """Hand a claim held for process ``pid`` (``hold_for_process``) to ``owner``, that process's connection
        naming ``key``: from here the claim lives and ends with that connection, as any other."""
        self.claims.adopt(key, owner, pid)

    def take_changed(self) -> set[str]:
        """Keys published or released since the last call: requests parked on them may now proceed."""
        return self.claims.take_changed()

    def holds_claims(self, owner: int) -> bool:
        """Whether ``owner`` holds any claim (its connection must then stay open, however idle)."""
        return self.claims.holds(owner)

    def release(self, key: str, owner: int) -> bool:
        """Drop ``owner``'s claim on ``key`` (its loader failed); one waiter then gets ``claimed``."""
        return self.claims.release(key, owner)

    def release_all(self, owner: int, who: str = "") -> list[str]:
        """Drop every claim of ``owner`` (its connection closed); returns the keys released."""
        keys = self.claims.release_all(owner)
        if keys:
            # Logged before any waiter is answered, so the line is in the log before it can act on the release.
            log.info("%s closed holding claims on %d keys; released them", who or f"owner {owner}", len(keys))
        return keys

    # ---- publish ---------------------------------------------------------------------------------------
    def publish(self, key: str, owner: int, fd: int, deps: list[str], meta: dict[str, Any],
                held: list[tuple[str, int]] | None = None, *,
                files: list[tuple[dict[str, Any], int]] | None = None) -> GetOutcome:
        """Store ``fd`` (ownership passes to the store, closed on refusal) as ``key``; answer like a ``get``
        hit on it (not counted as a hit), so the publisher maps what it published without asking again.
        ``held`` are the blob keys and offsets of the storages the memfd holds (see :mod:`.blobs`).
        ``files``: ``(description, fd)`` of the checkpoint files ``deps`` names (file entries), each fd owned
        by the store from here; one that is not the file described refuses the publish (``file changed``)."""
        try:
            adopted = self._adopt_files(files or [])
        except BaseException:
            _close_quietly(fd)
            raise
        try:
            return self._hit(self._store(key, owner, fd, deps, meta, held or []))
        finally:
            for file_id in adopted:  # refused, or the key was already cached: a file nobody references goes
                file_entry = self._by_id.get(file_id)
                if file_entry is not None and not file_entry.referenced_by:
                    self._remove(file_entry)

    def store_import(self, key: str, owner: int, fd: int, meta: dict[str, Any],
                     parts: list[tuple[str, str, str, dict | None, int]]) -> GetOutcome:
        """Store an entry imported from the fleet (``server/imports.py``): ``fd`` its sealed memfd,
        ``parts`` ``(publisher's id, kind, digest, file description or None, fd)`` of the blobs it
        depends on: a sealed memfd, or a checkpoint file of this machine (described as a publish's
        files are); every fd passes to the store. Answered like :meth:`publish`. A part already held
        (another import shares the blob) is reused and its new fd closed."""
        made: list[str] = []
        fleet_ids: dict[str, str] = {}
        try:
            for i, (foreign, kind, digest, local_file, part_fd) in enumerate(parts):
                if local_file is not None:
                    try:
                        created = self._file_entry(local_file, part_fd)
                    except BaseException:
                        for *_, rest in parts[i:]:
                            _close_quietly(rest)
                        raise
                    fleet_ids[foreign] = local_file["entry_id"]
                    if created is not None:
                        made.append(created.entry_id)
                    continue
                local = imports.part_id(kind, digest)
                fleet_ids[foreign] = local
                if local in self._by_id:
                    _close_quietly(part_fd)
                    continue
                try:
                    size = sealing.sealed_size(part_fd)
                except sealing.NotSealed as exc:
                    for *_, rest in parts[i:]:
                        _close_quietly(rest)
                    raise StoreError("not sealed", f"adopt refused: part {local}: {exc}.") from None
                now = time.time()
                part = Entry(local, "", part_fd, blobs.held_bytes(part_fd, size),
                             {"digest": digest, "kind": kind}, [], created=now, last_used=now,
                             lru=next(self._ticks))
                part.part = True
                self._by_id[local] = part
                self._used += part.nbytes
                made.append(local)
        except BaseException:
            for local in made:
                self._remove(self._by_id[local])
            _close_quietly(fd)
            raise
        meta = dict(meta, **{imports.FLEET_IDS: fleet_ids})
        try:
            outcome = self._hit(self._store(key, owner, fd, list(dict.fromkeys(fleet_ids.values())),
                                            meta, [], imported=True))
        finally:
            for local in made:  # refused, or the key was cached meanwhile: parts nobody references go
                left = self._by_id.get(local)
                if left is not None and not left.referenced_by:
                    self._remove(left)
        return outcome

    def _adopt_files(self, files: list[tuple[dict[str, Any], int]]) -> list[str]:
        """Take each described file's fd as its file entry (or close it if that entry exists); the ids
        created. Every fd is closed or kept, whatever is raised."""
        created: list[str] = []
        try:
            for i, (description, fd) in enumerate(files):
                try:
                    entry = self._file_entry(description, fd)
                except BaseException:
                    for _, rest in files[i:]:
                        _close_quietly(rest)
                    raise
                if entry is not None:
                    created.append(entry.entry_id)
        except BaseException:
            for file_id in created:
                self._remove(self._by_id[file_id])
            raise
        return created

    def _file_entry(self, description: dict[str, Any], fd: int) -> Entry | None:
        """A new file entry for ``fd`` (None if it exists already and ``fd`` was closed)."""
        if not isinstance(description, dict):
            description = {}
        path, entry_id = description.get("path"), description.get("entry_id")
        values = [description.get(f) for f in FILE_IDENTITY_FIELDS]
        if (not isinstance(path, str) or not isinstance(entry_id, str) or not is_file_entry(entry_id)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
            raise StoreError("bad request", f"publish refused: a file must be described by entry_id, path and "
                             f"{', '.join(FILE_IDENTITY_FIELDS)}, got {description!r}")
        claimed = {f: int(v) for f, v in zip(FILE_IDENTITY_FIELDS, values)}  # type: ignore[arg-type]
        if file_entry_id(claimed) != entry_id:
            raise StoreError("bad request", f"publish refused: file entry id {entry_id} is not the id of the "
                             f"identity described for {path}")
        try:
            st = os.fstat(fd)
            mode = _access_mode(fd)
        except OSError as exc:
            raise StoreError("file changed", f"publish refused: cannot fstat the fd sent for {path} "
                             f"({exc.strerror})") from None
        if not stat.S_ISREG(st.st_mode) or mode != os.O_RDONLY:
            raise StoreError("bad request", f"publish refused: the fd sent for {path} is not a regular file "
                             f"opened read-only")
        if file_identity(st) != claimed or st.st_nlink == 0:
            raise StoreError("file changed", f"publish refused: {path} changed since the client read its pages "
                             f"(now {file_identity(st)}, the client saw {claimed}); load again.")
        if entry_id in self._by_id:
            os.close(fd)
            return None
        now = time.time()
        entry = Entry(entry_id, "", fd, 0, {"path": path}, [], created=now, last_used=now, lru=next(self._ticks),
                      path=path, identity=claimed)
        self._by_id[entry_id] = entry
        log.info("file entry %s for %s (%d bytes of page cache, not counted in the budget)", entry_id, path,
                 st.st_size)
        return entry

    def _store(self, key: str, owner: int, fd: int, deps: list[str], meta: dict[str, Any],
               held: list[tuple[str, int]] | None = None, imported: bool = False) -> Entry:
        try:
            try:
                # Pages really held: storages found in other entries were left as holes (overmind.entries.dedup).
                nbytes = blobs.held_bytes(fd, sealing.sealed_size(fd))
            except sealing.NotSealed as exc:
                raise StoreError("not sealed", f"publish refused: {exc}.") from None
            existing = self._by_key.get(key)
            if existing is not None and self._retire_changed(self._closure([existing.entry_id])):
                existing = None
            if existing is not None:
                # Two loaders raced without claims (or one published twice): first one wins, the new fd is
                # redundant.
                self.claims.settle(key)  # the key is cached: waiters wake and take the hit
                os.close(fd)
                return existing
            # A dependency whose checkpoint file changed is no longer what the new entry's bytes were read from.
            self._retire_changed(self._closure([d for d in deps if d in self._by_id]))
            missing = [d for d in deps if d not in self._by_id]
            if missing:
                raise StoreError(
                    "dep missing",
                    f"publish refused: dependency entries {missing} are not (or no longer) cached; they "
                    f"were evicted after this entry was written. Load again to rebuild it.",
                )
            self._make_room(nbytes, protected=set(self._closure(deps)), key=key)
            now = time.time()
            entry = Entry(f"{key[:16]}-{self._nonce}-{next(self._ids)}", key, fd, nbytes, meta,
                          list(dict.fromkeys(deps)), created=now, last_used=now, lru=next(self._ticks))
            self._by_key[key] = entry
            self._by_id[entry.entry_id] = entry
            for d in entry.deps:
                self._by_id[d].referenced_by.add(entry.entry_id)
            self._used += nbytes
            self.blobs.add(entry.entry_id, held or [])
            self.counters["publishes" if not imported else "fleet_imports"] += 1
            self.refusals.forget(key)
            self.marks.drop(key)
            self.claims.settle(key)  # the key is cached: waiters wake and take the hit
            log.info("published %s (%d bytes, deps %s); %d/%d bytes used", entry.entry_id, nbytes,
                     entry.deps, self._used, self.max_bytes)
            if not imported and self.on_publish is not None:
                self.on_publish(entry, [self._by_id[i] for i in self._closure(entry.deps)])
            return entry
        except BaseException:
            _close_quietly(fd)
            raise

    def admit(self, key: str, need: int) -> dict[str, Any]:
        """Whether an entry of ``need`` bytes for ``key`` can be published now (evicting entries if
        it must), asked before the publisher pickles and writes it. One larger than the whole budget
        is remembered as refused for ``key`` (see :mod:`.admission`)."""
        refusal = self._refusal(key, need, set())
        return {"admitted": True} if refusal is None else refusal

    def _refusal(self, key: str, need: int, protected: set[str]) -> dict[str, Any] | None:
        """None when ``need`` bytes fit now, with or without evicting; else the refusal (:meth:`_refused`)."""
        if self._plan_eviction(need, protected) is not None:
            return None
        return self._refused(key, need, protected)

    def _refused(self, key: str, need: int, protected: set[str]) -> dict[str, Any]:
        """The refusal of ``need`` bytes no eviction can make room for: larger than the whole budget (remembered for
        ``key``), or the rest of the budget held by entries in use."""
        if need > self.max_bytes:
            if key:
                self.refusals.remember(key, need, self.max_bytes)
            return admission.verdict("budget", need, self.max_bytes, self.max_bytes)
        return admission.verdict("in use", need, self.max_bytes, self.max_bytes - self._pinned_bytes(protected))

    def _pinned_bytes(self, protected: set[str]) -> int:
        """Bytes of entries no eviction may take now (referenced by another entry, or protected)."""
        return eviction.held_bytes(self._items(protected))

    def _make_room(self, need: int, protected: set[str], key: str = "") -> None:
        """Evict entries in the store's order until ``need`` more bytes fit, or refuse."""
        plan = self._plan_eviction(need, protected)
        if plan is None:
            raise StoreError("budget", f"publish refused: {self._refused(key, need, protected)['message']}.")
        for victim in plan:
            log.info("evicting %s (%d bytes, %s) to fit %d bytes", victim.entry_id, victim.nbytes,
                     self.order.name, need)
            self._remove(victim, keep=protected)
            self.counters["evictions"] += 1

    def _plan_eviction(self, need: int, protected: set[str]) -> list[Entry] | None:
        """The entries to evict for ``need`` more bytes (:func:`.eviction.plan`); None when none
        can make room."""
        if self._used + need <= self.max_bytes:
            return []
        plan = eviction.plan(self._items(protected), need, self.max_bytes, self.order)
        return None if plan is None else [self._by_id[eid] for eid in plan]

    def _items(self, protected: set[str]) -> list[eviction.Item]:
        """Every entry as the eviction planner sees it; ``protected`` ones pinned."""
        return [eviction.Item(e.entry_id, e.nbytes, e.lru, e.created, e.hits, tuple(e.deps),
                              e.entry_id in protected, e.keyless) for e in self._by_id.values()]

    # ---- bad entries ---------------------------------------------------------------------------------
    def mark_bad(self, key: str, entry_id: str) -> bool:
        """Take entry ``entry_id`` of ``key`` out of service (a client could not rebuild it): the next get of
        ``key`` is a miss or claim. False when that is not the entry serving ``key`` (already replaced)."""
        entry = self._by_key.get(key)
        if entry is None or entry.entry_id != entry_id:
            return False
        del self._by_key[key]
        entry.bad = True
        if entry.referenced_by:
            log.info("marked %s bad: no longer served; kept while entries %s reference it", entry_id,
                     sorted(entry.referenced_by))
        else:
            log.info("marked %s bad: no longer served; evicted", entry_id)
            self._remove(entry)
        return True

    def _retire_changed(self, ids: list[str]) -> bool:
        """Take out of service every entry depending on a file entry among ``ids`` whose file changed (and free
        those nobody references); whether there was one."""
        changed = [self._by_id[i] for i in ids if is_file_entry(i) and self._by_id[i].changed()]
        if not changed:
            return False
        affected: dict[str, Entry] = {}
        todo = list(changed)
        while todo:
            e = todo.pop()
            if e.entry_id in affected:
                continue
            affected[e.entry_id] = e
            todo.extend(self._by_id[r] for r in e.referenced_by if r in self._by_id)
        for e in affected.values():
            if not e.is_file and self._by_key.get(e.key) is e:
                del self._by_key[e.key]
            e.bad = True
        log.info("checkpoint files %s changed on disk: entries %s no longer served",
                 [f.path for f in changed], sorted(i for i, e in affected.items() if not e.is_file))
        for e in list(affected.values()):
            if not e.referenced_by:
                self._remove(e)  # frees the entries below it that nothing else references
        return True

    # ---- fds, listing, eviction ------------------------------------------------------------------------
    def fds(self, entry_ids: list[str]) -> list[int]:
        """Duplicates of the fds of ``entry_ids``, in order; the caller closes them."""
        missing = [e for e in entry_ids if e not in self._by_id]
        if missing:
            raise StoreError("unknown entry", f"entries {missing} are not cached (evicted or never "
                             f"published); run 'overmind ls' to see what is.")
        if self._retire_changed(self._closure(entry_ids)):
            return self.fds(entry_ids)  # unknown entry now, if one of them depended on a changed file
        for eid in entry_ids:
            self._touch(self._by_id[eid])
        return self._dup(entry_ids)

    def find_blobs(self, keys: list[str]) -> tuple[list[tuple[int, str, int]], list[str], list[int]]:
        """Candidates for blob ``keys``: ``(found, entry_ids, fds)``, ``found`` as ``BlobIndex.find``, and a
        duplicated fd (the caller closes it) of each entry named there, so the caller can compare the bytes."""
        found = [f for f in self.blobs.find(keys) if f[1] in self._by_id]
        ids = list(dict.fromkeys(f[1] for f in found))
        return found, ids, self._dup(ids)

    def evict(self, key: str | None = None, *, all: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
        """Evict ``key`` (refused while another entry references it) or everything; ``(evicted, refused)``."""
        if all:
            victims = [e for e in self._by_id.values() if not e.is_file]
            for e in list(self._by_id.values()):
                self._remove(e)
            self.counters["evictions"] += len(victims)
            dropped = self.marks.clear()
            log.info("evicted all %d entries and %d marks on request", len(victims), dropped)
            return [e.key for e in victims], []
        entry = self._by_key.get(key) if key is not None else None
        if entry is None:
            return [], [{"key": key, "reason": "not cached"}]
        if entry.referenced_by:
            return [], [{"key": key, "reason": f"referenced by entries {sorted(entry.referenced_by)}; "
                                              f"evict those first, or evict --all"}]
        self._remove(entry)
        self.counters["evictions"] += 1
        log.info("evicted %s on request", entry.entry_id)
        return [entry.key], []

    def listing(self) -> list[dict[str, Any]]:
        """Every entry's ``ls`` fields, oldest first."""
        return [e.listing() for e in sorted(self._by_id.values(), key=lambda e: e.created) if not e.is_file]

    def file_listing(self) -> list[dict[str, Any]]:
        """Every file entry's ``ls`` fields (the checkpoint files entries reference), oldest first."""
        return [e.file_listing() for e in sorted(self._by_id.values(), key=lambda e: e.created) if e.is_file]

    def stats(self) -> dict[str, int]:
        """Counts for the ``status`` reply (``entries`` and ``bytes``: memfd entries; ``files`` and
        ``file_bytes``: the checkpoint files they reference, page cache outside the budget)."""
        files = [e.identity["size"] for e in self._by_id.values() if e.identity is not None]
        return {"entries": len(self._by_id) - len(files), "files": len(files), "file_bytes": sum(files),
                "bytes": self._used, "max_bytes": self.max_bytes,
                "claims": len(self.claims), "blobs": len(self.blobs), "refused_keys": len(self.refusals),
                "marks": len(self.marks), "marked_bytes": sum(m["nbytes"] for m in self.marks.listing()),
                **self.counters}

    def close_all(self) -> None:
        """Close every fd the store holds (server shutdown)."""
        for e in list(self._by_id.values()):
            self._remove(e)

    # ---- helpers -------------------------------------------------------------
    def _touch(self, entry: Entry) -> None:
        entry.last_used = time.time()
        entry.lru = next(self._ticks)

    def _hit(self, entry: Entry) -> GetOutcome:
        ids = self._closure([entry.entry_id])
        return GetOutcome("hit", entry.public(), ids, self._dup(ids))

    def _closure(self, ids: list[str]) -> list[str]:
        """``ids`` then every entry they transitively depend on, each once, breadth first."""
        order = list(dict.fromkeys(ids))
        seen = set(order)
        i = 0
        while i < len(order):
            for d in self._by_id[order[i]].deps:
                if d not in seen:
                    seen.add(d)
                    order.append(d)
            i += 1
        return order

    def _dup(self, ids: list[str]) -> list[int]:
        fds: list[int] = []
        try:
            for eid in ids:
                fds.append(os.dup(self._by_id[eid].fd))
        except BaseException as exc:
            for fd in fds:
                _close_quietly(fd)
            if isinstance(exc, OSError):
                raise StoreError("server fds", f"the server cannot duplicate entry fds ({exc.strerror}); it may "
                                 f"be at its open-file limit. Run 'overmind evict' on unused entries, or "
                                 f"raise 'ulimit -n' and restart it with 'overmind stop'.") from None
            raise
        return fds

    def _remove(self, entry: Entry, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Remove ``entry`` and close its fd, then each keyless entry it was the last to reference
        (those in ``keep`` stay: the dependencies of an entry being published)."""
        if self._by_id.get(entry.entry_id) is not entry:
            return  # already gone (a bad dependency removed along with its last referent)
        if self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        del self._by_id[entry.entry_id]
        self.blobs.remove(entry.entry_id)
        self._used -= entry.nbytes
        _close_quietly(entry.fd)
        for d in entry.deps:
            dep = self._by_id.get(d)
            if dep is not None:
                dep.referenced_by.discard(entry.entry_id)
                if dep.keyless and not dep.referenced_by and d not in keep:
                    log.info("evicting %s entry %s: its last referent %s is gone",
                             "file" if dep.is_file else "imported part" if dep.part else "bad", d,
                             entry.entry_id)
                    self._remove(dep, keep)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _access_mode(fd: int) -> int:
    """The access mode of ``fd`` (``os.O_RDONLY``, ``O_WRONLY`` or ``O_RDWR``)."""
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
