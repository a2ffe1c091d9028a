"""What a fleet store offers (:class:`Store`), and its layout. :func:`overmind.fleet.config.open_store` opens
one by its URL: a :class:`~overmind.fleet.dir_store.DirStore` or an :class:`~overmind.fleet.s3_store.S3Store`.

Both stores keep one layout below their root (a directory, or a bucket and prefix): ``blobs/sha256/<hex>``
holds a blob, named by the sha256 of its bytes, and ``refs/<portable key>`` the signed manifest of one entry.
An object appears whole or not at all (a directory store renames a complete temporary file into place; S3
makes an object visible when its upload completes), so a reader never sees half a blob or half a ref. Names
are checked to be 64 lowercase hex digits: nothing outside the layout can be named.
"""
from __future__ import annotations

import re
from typing import BinaryIO

_HEX64 = re.compile(r"[0-9a-f]{64}")
BLOBS = "blobs/sha256/"
REFS = "refs/"


def is_name(text: str) -> bool:
    """Whether ``text`` is a blob digest or portable key: 64 lowercase hex digits."""
    return isinstance(text, str) and _HEX64.fullmatch(text) is not None


def check_name(text: str, what: str) -> str:
    if not is_name(text):
        raise ValueError(f"a fleet {what} is 64 lowercase hex digits, not {text!r}")
    return text


class Store:
    """A fleet store. ``url`` names it in every message. Any failure of the store raises
    :class:`~overmind.fleet.errors.StoreError`; a blob that is not there,
    :class:`~overmind.fleet.errors.NotInStore`."""

    url: str

    def has_blob(self, digest: str) -> bool:
        """Whether the blob named ``digest`` is in the store."""
        raise NotImplementedError

    def put_blob(self, digest: str, fileobj: BinaryIO, size: int) -> None:
        """Store ``size`` bytes read from ``fileobj`` (positioned at 0) as the blob ``digest``. The caller
        computed the digest; the store trusts it (a reader checks every blob against its manifest)."""
        raise NotImplementedError

    def open_blob(self, digest: str) -> BinaryIO:
        """A readable binary stream of the blob ``digest``; close it after reading."""
        raise NotImplementedError

    def get_ref(self, portable_key: str) -> bytes | None:
        """The manifest stored for ``portable_key``, or None when there is none."""
        raise NotImplementedError

    def put_ref(self, portable_key: str, data: bytes) -> None:
        """Store ``data`` as the manifest of ``portable_key`` (replacing one that is there)."""
        raise NotImplementedError

    def refs(self) -> list[str]:
        """The portable keys that have a manifest, sorted."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
