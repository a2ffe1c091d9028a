"""A fleet store in an S3-compatible bucket (AWS S3, GCS, Ceph, MinIO, SeaweedFS), through boto3.

Credentials, region and endpoint come from boto3's own chain (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, an
instance role, ``AWS_ENDPOINT_URL`` for a store that is not AWS), never from Overmind's settings. Every
request has the fleet timeout to connect and for each read, and two attempts in all (``total_max_attempts``:
boto3's ``max_attempts`` counts retries only): a store that is down or stalled costs a load about twice the
timeout at most, not minutes. A blob up to :attr:`S3Store.multipart_above` bytes is one PUT; a larger
one a multipart upload. Either way the object appears only when complete, and a failed multipart upload is
aborted (a lifecycle rule for incomplete uploads sweeps what a killed process leaves).
"""
from __future__ import annotations

from typing import Any, BinaryIO

from .._util import interrupts
from .errors import NotInStore, StoreError
from .stores import BLOBS, REFS, Store, check_name, is_name

_ADVICE = ("check that the store is reachable, the bucket exists, and boto3's credentials and endpoint "
           "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) are right")


class S3Store(Store):
    """The store under ``prefix`` in ``bucket``; ``timeout``: seconds to connect and per read."""

    multipart_above = 512 << 20
    part_size = 64 << 20

    def __init__(self, bucket: str, prefix: str, timeout: float):
        import boto3
        from botocore import exceptions
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._errors = (exceptions.BotoCoreError, exceptions.ClientError)
        config = Config(connect_timeout=timeout, read_timeout=timeout, signature_version="s3v4",
                        retries={"total_max_attempts": 2, "mode": "standard"}, s3={"addressing_style": "path"})
        self._client = boto3.session.Session().client("s3", config=config)

    def _fail(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(self.url, f"{what} failed ({type(exc).__name__}: {exc}); {_ADVICE}")

    def _code(self, exc: BaseException) -> str:
        return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))

    def has_blob(self, digest: str) -> bool:
        key = self.prefix + BLOBS + check_name(digest, "blob digest")
        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
        except self._errors as exc:
            if self._code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(f"looking for blob {digest}", exc) from exc
        return True

    def put_blob(self, digest: str, fileobj: BinaryIO, size: int) -> None:
        key = self.prefix + BLOBS + check_name(digest, "blob digest")
        if self.has_blob(digest):
            return
        try:
            if size <= self.multipart_above:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=_Window(fileobj, size),
                                        ContentLength=size)
            else:
                self._multipart(key, fileobj, size)
        except self._errors as exc:
            raise self._fail(f"uploading blob {digest} ({size} bytes)", exc) from exc

    def _multipart(self, key: str, fileobj: BinaryIO, size: int) -> None:
        upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            left = size
            while left:
                data = _read_fully(fileobj, min(self.part_size, left))
                if not data:
                    raise StoreError(self.url, f"{key}: the source ended {left} bytes short of {size}; the "
                                               "entry changed while it was uploaded")
                left -= len(data)
                number = len(parts) + 1
                etag = self._client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number,
                                                Body=data)["ETag"]
                parts.append({"ETag": etag, "PartNumber": number})
            self._client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload,
                                                   MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            except self._errors:
                pass  # the store is failing already; the first error is the one to report
            raise

    def open_blob(self, digest: str) -> BinaryIO:
        key = self.prefix + BLOBS + check_name(digest, "blob digest")
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self._errors as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                raise NotInStore(self.url, "blob " + digest) from None
            raise self._fail(f"reading blob {digest}", exc) from exc
        return _Body(body, self, digest)  # type: ignore[return-value]

    def get_ref(self, portable_key: str) -> bytes | None:
        key = self.prefix + REFS + check_name(portable_key, "portable key")
        try:
            return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self._errors as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                return None
            raise self._fail(f"reading ref {portable_key}", exc) from exc

    def put_ref(self, portable_key: str, data: bytes) -> None:
        key = self.prefix + REFS + check_name(portable_key, "portable key")
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except self._errors as exc:
            raise self._fail(f"writing ref {portable_key}", exc) from exc

    def refs(self) -> list[str]:
        start = self.prefix + REFS
        found = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                found += [o["Key"][len(start):] for o in page.get("Contents", ())]
        except self._errors as exc:
            raise self._fail("listing refs", exc) from exc
        return sorted(n for n in found if is_name(n))


class _Window:
    """The first ``size`` bytes of ``fileobj`` as a seekable body: botocore reads it to sign the payload, then
    seeks back to send it (and again to retry)."""

    def __init__(self, fileobj: BinaryIO, size: int):
        self._file, self._size, self._start = fileobj, size, fileobj.tell()

    def read(self, n: int = -1) -> bytes:
        left = self._size - (self._file.tell() - self._start)
        return self._file.read(left if n is None or n < 0 else min(n, left)) if left > 0 else b""

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            target = self._start + offset
        elif whence == 1:
            target = self._file.tell() + offset
        else:
            target = self._start + self._size + offset
        return self._file.seek(target) - self._start

    def tell(self) -> int:
        return self._file.tell() - self._start


class _Body:
    """A blob's response body whose read errors (a stall past the timeout, a connection cut, fewer bytes than
    announced) raise :class:`StoreError`."""

    def __init__(self, body: Any, store: S3Store, digest: str):
        self._body, self._store, self._digest = body, store, digest

    def read(self, n: int = -1) -> bytes:
        try:
            return self._body.read(None if n is None or n < 0 else n)
        except (*self._store._errors, OSError) as exc:
            interrupts.raise_users(exc)
            raise self._store._fail(f"reading blob {self._digest}", exc) from exc

    def close(self) -> None:
        self._body.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_fully(fileobj: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes of ``fileobj``, short only at its end: a part of a multipart upload must be
    whole (every part but the last at least 5 MiB)."""
    chunks, got = [], 0
    while got < n:
        data = fileobj.read(n - got)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)
