"""Entries imported from the fleet (``overmind.fleet``): a client that found the entry of its call in
the fleet's store streams its blobs into sealed memfds and hands them to the server (op ``adopt``);
the entry itself is stored under the client's local key, and each blob it depends on becomes a
*part*: a keyless entry held while an entry references it. A checkpoint file the entry references
that the client's node holds itself (the same bytes) is not downloaded: the client sends that file,
which becomes a file entry as a publish's files do.

A part is named by its content, ``file-sha256-<digest>`` for a checkpoint file's bytes (mapped whole,
as a reader maps a checkpoint file) and ``blob-sha256-<digest>`` for an entry's memfd (mapped by its
header), so two imported entries that share a blob share one part in memory. The entry's skeleton
names its dependencies by the ids they had on the node that published it; the entry's meta gains
``fleet_ids``, publisher id -> part id, which a rebuild reads (``entries/codec.py``).
"""
from __future__ import annotations

import re

from ..errors import OvermindError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FLEET_IDS = "fleet_ids"  # meta of an imported entry: {publisher's entry id: part id}
KINDS = ("entry", "file")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_FOREIGN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


class BadImport(OvermindError, ValueError):
    """An ``adopt`` request whose parts are not of the documented shape."""


def part_id(kind: str, digest: str) -> str:
    """The id of the part holding the blob ``digest``: a file's bytes are a file entry to a reader.

    >>> part_id("file", "ab" * 32)[:17]
    'file-sha256-ababa'
    """
    return f"{'file' if kind == 'file' else 'blob'}-sha256-{digest}"


def parse_parts(raw: Any, fd_count: int) -> list[tuple[str, str, str, dict | None]]:
    """An ``adopt`` request's ``parts`` (``[{entry_id, kind, digest, file?}]``) checked: one fd each,
    after the entry's own; raises :class:`BadImport`. ``file``: the part is a checkpoint file of this
    machine holding the blob's bytes, described as a publish describes a file (its fd read-only)."""
    if not isinstance(raw, list) or len(raw) != fd_count:
        raise BadImport(f"'parts' must list one {{entry_id, kind, digest}} per fd after the entry's "
                        f"own ({fd_count}), got {raw!r:.120}")
    parts = []
    for item in raw:
        ok = (isinstance(item, dict) and item.get("kind") in KINDS
              and isinstance(item.get("digest"), str) and _DIGEST.match(item["digest"])
              and isinstance(item.get("entry_id"), str) and _FOREIGN_ID.match(item["entry_id"]))
        if not ok:
            raise BadImport(f"'parts' items must be {{\"entry_id\", \"kind\": \"entry\"|\"file\", "
                            f"\"digest\": <sha256 hex>}}, got {item!r:.120}")
        local = item.get("file")
        if local is not None and (item["kind"] != "file" or not isinstance(local, dict)):
            raise BadImport(f"a part's 'file' describes a checkpoint file of kind 'file', got {item!r:.120}")
        parts.append((item["entry_id"], item["kind"], item["digest"], local))
    return parts
