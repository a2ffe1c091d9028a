"""One entry the server holds: a published memfd, or a checkpoint file entries reference (a file
entry), with what the server knows of it (key, size, dependencies, uses, the entries referencing it)
and the fields its replies carry.
"""
from __future__ import annotations

import os

from ..ipc.protocol import FILE_IDENTITY_FIELDS, file_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Entry:
    """One published memfd and what the server knows about it.

    ``bad``: out of service, kept only while other entries reference it. A file entry's ``path`` is
    the checkpoint file's path as the publisher saw it, and its ``identity`` the
    ``protocol.file_identity`` when published (None for a memfd entry). ``part``: a blob of an
    entry imported from the fleet (``server/imports.py``), kept while an entry references it."""

    __slots__ = ("entry_id", "key", "fd", "nbytes", "meta", "deps", "created", "last_used", "lru",
                 "hits", "referenced_by", "bad", "path", "identity", "part")

    def __init__(self, entry_id: str, key: str, fd: int, nbytes: int, meta: dict[str, Any],
                 deps: list[str], created: float, last_used: float, lru: int, path: str = "",
                 identity: dict[str, int] | None = None) -> None:
        self.entry_id, self.key, self.fd, self.nbytes = entry_id, key, fd, nbytes
        self.meta, self.deps = meta, deps
        self.created, self.last_used, self.lru = created, last_used, lru
        self.hits = 0
        self.referenced_by: set[str] = set()
        self.bad = False
        self.path = path
        self.identity = identity
        self.part = False

    def __repr__(self) -> str:
        return (f"Entry({self.entry_id!r}, key={self.key!r}, nbytes={self.nbytes}, "
                f"file={self.is_file})")

    @property
    def is_file(self) -> bool:
        return self.identity is not None

    @property
    def keyless(self) -> bool:
        """Kept only while another entry references it (out of service, a file entry, an imported
        part)."""
        return self.bad or self.is_file or self.part

    def changed(self) -> bool:
        """Whether a file entry's file is no longer what it was when published (or was deleted)."""
        if self.identity is None:
            return False
        try:
            st = os.fstat(self.fd)
        except OSError:
            return True
        return st.st_nlink == 0 or file_identity(st) != self.identity

    def public(self) -> dict[str, Any]:
        """The fields a ``hit`` reply carries."""
        return {"entry_id": self.entry_id, "key": self.key, "nbytes": self.nbytes,
                "meta": self.meta, "deps": list(self.deps)}

    def listing(self) -> dict[str, Any]:
        """The fields an ``ls`` reply carries."""
        # ino: the memfd's inode, which /proc/<pid>/maps shows, so 'overmind ls' can tell who maps
        # the entry.
        return dict(self.public(), hits=self.hits, created=self.created, last_used=self.last_used,
                    referenced_by=sorted(self.referenced_by), ino=os.fstat(self.fd).st_ino)

    def file_listing(self) -> dict[str, Any]:
        """A file entry's fields in an ``ls`` reply (its ``files`` list)."""
        assert self.identity is not None
        return {"entry_id": self.entry_id, "path": self.path, "nbytes": self.identity["size"],
                "referenced_by": sorted(self.referenced_by), "created": self.created,
                "changed": self.changed(), **{f: self.identity[f] for f in FILE_IDENTITY_FIELDS}}
