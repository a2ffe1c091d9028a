"""The cache as data (``cache_info()``, ``evict()``, :class:`CacheInfo`): what ``overmind ls``, ``status`` and
``evict`` show, as typed Python objects.

>>> import overmind
>>> info = overmind.cache_info()            # never starts a server
>>> info.running, len(info.entries), info.size_on_server
(True, 4, 92614656)
>>> [e.short_loader for e in info.entries]
['BertModel.from_pretrained', 'AutoModel.from_pretrained', ...]
>>> overmind.evict("63ef86", dry_run=True).evicted      # any unique prefix of a key or entry id
['63ef869afe2814103c3af965c46bb15259c711eb']

This module imports only the standard library and the light parts of overmind (no torch).
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ._util import interrupts
from .errors import OvermindError

log = logging.getLogger("overmind")

__all__ = ["CacheEntry", "CacheFile", "CacheInfo", "EvictResult", "AmbiguousPrefix", "cache_info", "evict", "resolve"]


@dataclass(frozen=True)
class CacheFile:
    """A checkpoint file whose pages entries reference instead of copying them (a file entry): its bytes are
    the kernel's page cache of the file, shared with every plain load of it, and not in the memory budget."""

    entry_id: str
    path: str  # as the publishing process saw it (the file may since have been renamed)
    nbytes: int  # the file's size
    referenced_by: tuple[str, ...] = ()
    changed: bool = False  # the file changed on disk since (the next hit takes its entries out of service)


@dataclass(frozen=True)
class CacheMark:
    """A key loaded once and not published (admission by reuse): its next load publishes."""

    key: str
    loader: str  # the loader's qualified name
    summary: str  # the call's arguments, shortened
    nbytes: int  # the storage bytes its entry would hold (0: unknown)
    first_load: float
    last_load: float
    loads: int  # loads that ended with this mark

    @property
    def short_loader(self) -> str:
        return ".".join(self.loader.split(".")[-2:])


@dataclass(frozen=True)
class CacheEntry:
    """One cached load result."""

    entry_id: str
    key: str
    loader: str  # the loader's qualified name
    summary: str  # the call's arguments, shortened
    nbytes: int  # bytes of this entry's own memfd
    referenced_nbytes: int  # bytes of the entries it references (a pipeline's components), counted once
    hits: int  # gets answered from this entry (its publication not counted)
    created: float
    last_used: float
    deps: tuple[str, ...] = ()  # entry ids this one references
    referenced_by: tuple[str, ...] = ()  # entry ids referencing this one
    mapped_by: tuple[int, ...] | None = None  # pids mapping its memfd now; None where the server cannot tell
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    files: tuple[CacheFile, ...] = ()  # checkpoint files it references (transitively), not copied into memfds

    @property
    def file_nbytes(self) -> int:
        """Bytes of the checkpoint files it references: page cache, not counted in ``nbytes`` or the budget."""
        return sum(f.nbytes for f in self.files)

    @property
    def short_loader(self) -> str:
        """The loader's last two names: ``AutoModel.from_pretrained`` for
        ``transformers.models.auto.modeling_auto.AutoModel.from_pretrained``, ``torch.load`` for itself."""
        return ".".join(self.loader.split(".")[-2:])

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["deps"], out["referenced_by"] = list(self.deps), list(self.referenced_by)
        out["mapped_by"] = None if self.mapped_by is None else list(self.mapped_by)
        out["files"] = [dict(asdict(f), referenced_by=list(f.referenced_by)) for f in self.files]
        out["file_nbytes"] = self.file_nbytes
        return out


@dataclass(frozen=True)
class CacheInfo:
    """The server's state and its entries (``running`` False, no entries, when no server runs)."""

    running: bool
    runtime_dir: str
    entries: tuple[CacheEntry, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)
    files: tuple[CacheFile, ...] = ()  # the checkpoint files entries reference
    marks: tuple[CacheMark, ...] = ()  # keys loaded once and not published: their next load publishes

    @property
    def size_on_server(self) -> int:
        """Bytes of the server's memfds (what the budget counts)."""
        return sum(e.nbytes for e in self.entries)

    @property
    def file_bytes(self) -> int:
        """Bytes of the checkpoint files entries reference: page cache, outside the budget."""
        return sum(f.nbytes for f in self.files)

    @property
    def hit_rate(self) -> float | None:
        gets = self.status.get("gets")
        return None if not gets else self.status.get("hits", 0) / gets

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "runtime_dir": self.runtime_dir, "status": self.status,
                "entries": [e.to_json() for e in self.entries], "size_on_server": self.size_on_server,
                "hit_rate": self.hit_rate, "files": [dict(asdict(f), referenced_by=list(f.referenced_by))
                                                     for f in self.files], "file_bytes": self.file_bytes,
                "marks": [asdict(m) for m in self.marks]}


@dataclass(frozen=True)
class EvictResult:
    """What :func:`evict` did (or, with ``dry_run``, would do): the keys evicted, those refused with why, and
    the bytes of shared memory the evicted entries held (``freed_bytes``)."""

    evicted: list[str]
    refused: list[dict[str, str]]
    dry_run: bool = False
    freed_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PrefixError(OvermindError, LookupError):
    """A prefix that does not name exactly one entry."""


class NoSuchEntry(PrefixError):
    """A prefix that names no entry (an empty prefix included)."""


class AmbiguousPrefix(PrefixError):
    """A prefix that names more than one entry."""


class EvictUsage(OvermindError, ValueError):
    """An :func:`evict` call that names nothing to evict, or names entries and asks for all of them."""


def _client(runtime_dir: str | None, control: bool = False):
    from .client.connection import Client
    from .client.launcher import accepts

    client = Client(runtime_dir, autostart=False, control=control)
    return client, accepts(client.socket_path)


def cache_info(runtime_dir: str | None = None, *, processes: bool = True, control: bool = False) -> CacheInfo:
    """The running server's status and entries; never starts a server. ``processes``: find which processes
    of this user map each entry (reads /proc/<pid>/maps). ``control``: the ``overmind`` command's, whose requests
    wait ``OVERMIND_CONTROL_TIMEOUT`` for the server's answer (a program's wait ``OVERMIND_REPLY_TIMEOUT``)."""
    client, up = _client(runtime_dir, control)
    if not up:
        return CacheInfo(False, client.runtime_dir)
    try:
        status = client.status()
        listed = client.ls_all()
        raw = listed["entries"]
    finally:
        client.close()
    mapped = _mapping_pids({e["ino"] for e in raw if "ino" in e}) if processes else {}
    by_id = {e["entry_id"]: e for e in raw}
    files = {f["entry_id"]: CacheFile(f["entry_id"], str(f.get("path", "")), int(f.get("nbytes", 0)),
                                      tuple(f.get("referenced_by") or ()), bool(f.get("changed")))
             for f in listed["files"]}
    entries = []
    for e in raw:
        meta = e.get("meta") or {}
        refs = _closure(e["entry_id"], by_id) - {e["entry_id"]}
        pids = None
        if processes and "ino" in e:
            pids = tuple(sorted(mapped.get(e["ino"], ())))
        entries.append(CacheEntry(
            entry_id=e["entry_id"], key=e["key"], loader=str(meta.get("loader", "?")),
            summary=str(meta.get("summary", "")), nbytes=int(e["nbytes"]),
            referenced_nbytes=sum(int(by_id[r]["nbytes"]) for r in refs), hits=int(e.get("hits", 0)),
            created=float(e.get("created", 0)), last_used=float(e.get("last_used", 0)),
            deps=tuple(e.get("deps") or ()), referenced_by=tuple(e.get("referenced_by") or ()), mapped_by=pids,
            meta=meta, files=tuple(files[f] for f in sorted(_file_closure(e["entry_id"], by_id)) if f in files)))
    marks = tuple(CacheMark(str(m.get("key", "")), str(m.get("loader", "")), str(m.get("summary", "")),
                            int(m.get("nbytes", 0)), float(m.get("first_load", 0)), float(m.get("last_load", 0)),
                            int(m.get("loads", 0))) for m in listed.get("marks", []))
    return CacheInfo(True, client.runtime_dir, tuple(entries), status, tuple(files.values()), marks)


def resolve(prefix: str, entries: Iterable[CacheEntry]) -> CacheEntry:
    """The one entry whose key or entry id starts with ``prefix``; raises :class:`NoSuchEntry` for an empty
    prefix or one that names none, :class:`AmbiguousPrefix` for one that names several."""
    if not prefix:
        raise NoSuchEntry("overmind: an empty prefix names no entry; give the first characters of an ENTRY from "
                          "'overmind ls' (or all=True to evict every entry).")
    entries = list(entries)
    exact = [e for e in entries if prefix in (e.key, e.entry_id)]
    found = exact or [e for e in entries if e.key.startswith(prefix) or e.entry_id.startswith(prefix)]
    if not found:
        raise NoSuchEntry(f"overmind: no cached entry starts with {prefix!r}; 'overmind ls' lists them.")
    if len(found) > 1:
        names = ", ".join(e.key[:12] for e in found[:5])
        raise AmbiguousPrefix(f"overmind: {prefix!r} matches {len(found)} entries ({names}); give more characters.")
    return found[0]


def evict(*prefixes: str, all: bool = False, dry_run: bool = False, with_deps: bool = False,
          runtime_dir: str | None = None, control: bool = False) -> EvictResult:
    """Evict the entries named by unique prefixes of their keys or entry ids (or ``all``); ``dry_run`` only
    says what would go. ``with_deps``: also the entries they reference that nothing else references (a
    pipeline's components). An entry others reference is refused, naming them by their ENTRY (evict those
    first, or name them too). Raises :class:`EvictUsage` for no prefix and no ``all``, or both;
    :class:`NoSuchEntry` / :class:`AmbiguousPrefix` for a prefix that names none or several."""
    from .errors import ServerUnavailable

    if all and prefixes:
        raise EvictUsage(f"overmind: evict({', '.join(map(repr, prefixes))}, all=True) names entries and asks for "
                         f"all of them; give the prefixes or all=True, not both.")
    if not all and not prefixes:
        raise EvictUsage("overmind: evict() names no entry; give unique prefixes of ENTRY values from 'overmind ls', "
                         "or all=True to evict every entry.")
    info = cache_info(runtime_dir, processes=False, control=control)
    if not info.running:
        raise ServerUnavailable(f"overmind: no server is running for {info.runtime_dir}; nothing is cached.")
    by_id = {e.entry_id: e for e in info.entries}
    if all:
        targets = list(info.entries)
    else:
        targets = []
        for p in prefixes:
            e = resolve(p, info.entries)
            if e not in targets:
                targets.append(e)
        if with_deps:
            targets += _only_theirs(targets, by_id)
    going = {e.entry_id for e in targets}
    sizes = {e.key: e.nbytes for e in info.entries}
    if dry_run:
        evicted, refused = [], []
        for e in targets:
            others = [r for r in e.referenced_by if r not in going]
            if others:
                refused.append({"key": e.key, "reason": _blocked_by(others, by_id)})
            else:
                evicted.append(e.key)
        return EvictResult(evicted, refused, dry_run=True, freed_bytes=sum(sizes.get(k, 0) for k in evicted))
    client, _ = _client(runtime_dir, control)
    try:
        if all:
            out = client.evict(all=True)
            evicted = list(out["evicted"])
            return EvictResult(evicted, list(out["refused"]), freed_bytes=sum(sizes.get(k, 0) for k in evicted))
        evicted, refused = [], []
        # Referencing entries first, so an entry and the pipeline holding it go together when both are named.
        for e in sorted(targets, key=lambda e: -len(_closure(e.entry_id, {t.entry_id: {"deps": t.deps}
                                                                          for t in info.entries}))):
            out = client.evict(e.key)
            for key in out["evicted"]:
                log.info("evicted %s (%s, %d bytes) on request", key[:12], e.loader, e.nbytes)
            evicted += out["evicted"]
            refused += [dict(r, reason=_blocked_by(e.referenced_by, by_id, going)) if "referenced" in r["reason"]
                        else r for r in out["refused"]]
        return EvictResult(evicted, refused, freed_bytes=sum(sizes.get(k, 0) for k in evicted))
    finally:
        client.close()


def _only_theirs(targets: list[CacheEntry], by_id: dict[str, CacheEntry]) -> list[CacheEntry]:
    """The entries ``targets`` reference, directly or through each other, that no other entry references."""
    going = {e.entry_id for e in targets}
    added: list[CacheEntry] = []
    changed = True
    while changed:
        changed = False
        for e in list(targets) + added:
            for dep in e.deps:
                d = by_id.get(dep)
                if d is not None and dep not in going and set(d.referenced_by) <= going:
                    going.add(dep)
                    added.append(d)
                    changed = True
    return added


def _blocked_by(referencing: Iterable[str], by_id: dict[str, CacheEntry], going: Iterable[str] = ()) -> str:
    """Why an entry cannot go: the entries still referencing it, by their ENTRY (key) as ``overmind ls`` shows."""
    leaving = set(going)
    names = [f"{by_id[r].key[:12]} ({by_id[r].short_loader})" if r in by_id else r[:12]
             for r in referencing if r not in leaving]
    return f"referenced by {', '.join(names)}; evict those first, or name them too"


def _closure(entry_id: str, by_id: dict[str, Any]) -> set[str]:
    seen, todo = set(), [entry_id]
    while todo:
        eid = todo.pop()
        if eid in seen or eid not in by_id:
            continue
        seen.add(eid)
        deps = by_id[eid]["deps"] if isinstance(by_id[eid], dict) else by_id[eid].deps
        todo.extend(deps or ())
    return seen


def _file_closure(entry_id: str, by_id: dict[str, Any]) -> set[str]:
    """The file entries ``entry_id`` references, directly or through the entries it references."""
    from .ipc.protocol import is_file_entry

    return {d for e in _closure(entry_id, by_id) for d in (by_id[e]["deps"] or ()) if is_file_entry(d)}


def _mapping_pids(inodes: set[int]) -> dict[int, set[int]]:
    """inode -> pids of this user's processes with a ``memfd:overmind`` mapping of that inode."""
    found: dict[int, set[int]] = {}
    if not inodes:
        return found
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/maps", "rb") as f:
                for line in f:
                    if b"memfd:overmind" not in line:
                        continue
                    fields = line.split(None, 5)
                    ino = int(fields[4])
                    if ino in inodes:
                        found.setdefault(ino, set()).add(int(name))
        except (OSError, ValueError, IndexError) as exc:
            interrupts.raise_users(exc)
            continue  # gone, or another user's
    return found
