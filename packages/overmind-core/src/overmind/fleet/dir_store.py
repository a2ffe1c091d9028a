"""A fleet store in a directory: a shared file system (NFS, a mounted volume) or an exported OCI layout.

Every write goes to a temporary file beside its target, is flushed to disk (fsync) and renamed into place, so
a blob or ref is there whole or not at all, even when the writer is killed half-way (a killed writer leaves
only a ``.tmp-*`` file, which no reader looks at). Two nodes writing the same blob write the same bytes, and
the last rename wins; the same holds for a ref, whose every version is a valid signed manifest.
"""
from __future__ import annotations

import os
import secrets
from typing import BinaryIO

from .._util import interrupts
from .errors import NotInStore, StoreError
from .stores import BLOBS, REFS, Store, check_name, is_name

_CHUNK = 1 << 20
_ADVICE = "check that the directory exists, is mounted and is writable by this user, and that its disk has room"


class DirStore(Store):
    """The store whose root is the directory ``root`` (created on the first write)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    def has_blob(self, digest: str) -> bool:
        path = self._path(BLOBS + check_name(digest, "blob digest"))
        try:
            os.stat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            interrupts.raise_users(exc)
            raise StoreError(self.url, f"cannot look for blob {digest}: {exc}; {_ADVICE}") from exc
        return True

    def put_blob(self, digest: str, fileobj: BinaryIO, size: int) -> None:
        check_name(digest, "blob digest")
        if self.has_blob(digest):
            return
        self._write(BLOBS + digest, lambda out: _copy(fileobj, out, size, self.url, digest))

    def open_blob(self, digest: str) -> BinaryIO:
        path = self._path(BLOBS + check_name(digest, "blob digest"))
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise NotInStore(self.url, "blob " + digest) from None
        except OSError as exc:
            interrupts.raise_users(exc)
            raise StoreError(self.url, f"cannot read blob {digest}: {exc}; {_ADVICE}") from exc

    def get_ref(self, portable_key: str) -> bytes | None:
        path = self._path(REFS + check_name(portable_key, "portable key"))
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            interrupts.raise_users(exc)
            raise StoreError(self.url, f"cannot read ref {portable_key}: {exc}; {_ADVICE}") from exc

    def put_ref(self, portable_key: str, data: bytes) -> None:
        check_name(portable_key, "portable key")
        self._write(REFS + portable_key, lambda out: out.write(data))

    def refs(self) -> list[str]:
        try:
            names = os.listdir(self._path(REFS))
        except FileNotFoundError:
            return []
        except OSError as exc:
            interrupts.raise_users(exc)
            raise StoreError(self.url, f"cannot list refs: {exc}; {_ADVICE}") from exc
        return sorted(n for n in names if is_name(n))

    def put_file(self, relative: str, data: bytes) -> None:
        """Write ``data`` as the file ``relative`` (to the root), whole or not at all: a file beside the store's
        own, such as an OCI layout's ``index.json``."""
        self._write(relative, lambda out: out.write(data))

    def _write(self, relative: str, fill) -> None:
        """Write ``relative`` through a temporary file: ``fill(file)`` writes the bytes; then fsync, rename
        and fsync the folder, so the name appears only with all its bytes on disk."""
        target = self._path(relative)
        folder = os.path.dirname(target)
        temp = os.path.join(folder, f".tmp-{os.path.basename(target)[:16]}-{secrets.token_hex(6)}")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(temp, "xb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            os.rename(temp, target)
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            interrupts.raise_users(exc)
            _remove(temp)
            raise StoreError(self.url, f"cannot write {relative}: {exc}; {_ADVICE}") from exc
        except BaseException:
            _remove(temp)
            raise


def _copy(source: BinaryIO, out: BinaryIO, size: int, url: str, digest: str) -> None:
    left = size
    while left:
        chunk = source.read(min(_CHUNK, left))
        if not chunk:
            raise StoreError(url, f"blob {digest}: its source ended {left} bytes short of {size}; "
                                  "the entry changed while it was uploaded")
        out.write(chunk)
        left -= len(chunk)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        interrupts.raise_users(exc)
        pass
