"""Both stores (a directory, a SeaweedFS bucket) keep blobs and refs: what is put is got back byte for byte,
what was never put is absent, refs are listed, and a name outside the layout is refused."""
from __future__ import annotations

import hashlib
import io
import os

import pytest

from overmind.fleet.config import open_store
from overmind.fleet.errors import NotInStore
from overmind.fleet.s3_store import S3Store


def _blob(data: bytes) -> tuple[str, io.BytesIO]:
    return hashlib.sha256(data).hexdigest(), io.BytesIO(data)


def test_blobs_round_trip(store):
    data = os.urandom(300_000)
    digest, f = _blob(data)
    assert not store.has_blob(digest)
    with pytest.raises(NotInStore, match=digest):
        store.open_blob(digest)
    store.put_blob(digest, f, len(data))
    assert store.has_blob(digest)
    with store.open_blob(digest) as stream:
        assert stream.read() == data
    store.put_blob(digest, io.BytesIO(data), len(data))  # again: a no-op, the blob is there


def test_a_blob_is_the_first_size_bytes_of_its_source(store):
    data = b"abc" * 1000
    digest = hashlib.sha256(data[:1000]).hexdigest()
    store.put_blob(digest, io.BytesIO(data), 1000)
    with store.open_blob(digest) as stream:
        assert stream.read() == data[:1000]


def test_refs_round_trip(store):
    keys = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    assert store.refs() == [] and store.get_ref(keys[0]) is None
    for i, k in enumerate(keys):
        store.put_ref(k, b"manifest %d" % i)
    store.put_ref(keys[0], b"replaced")
    assert store.refs() == sorted(keys)
    assert store.get_ref(keys[0]) == b"replaced" and store.get_ref(keys[2]) == b"manifest 2"


@pytest.mark.parametrize("name", ["../../etc/passwd", "ABC", "a" * 63, "g" * 64, ""])
def test_a_name_outside_the_layout_is_refused(store, name):
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.get_ref(name)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.has_blob(name)


def test_the_directory_store_leaves_no_temporary_file(tmp_path):
    store = open_store(f"file://{tmp_path}", timeout=1)
    data = os.urandom(1000)
    digest, f = _blob(data)
    store.put_blob(digest, f, len(data))
    store.put_ref(digest, b"x")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [digest, digest]


def test_a_large_s3_blob_goes_up_in_parts(s3_url, monkeypatch):
    monkeypatch.setattr(S3Store, "multipart_above", 6 << 20)
    monkeypatch.setattr(S3Store, "part_size", 5 << 20)  # S3's smallest part
    store = open_store(s3_url, timeout=10)
    data = os.urandom(13 << 20)
    digest, f = _blob(data)
    store.put_blob(digest, f, len(data))
    with store.open_blob(digest) as stream:
        assert hashlib.sha256(stream.read()).hexdigest() == digest


@pytest.mark.parametrize("url", ["ftp://host/x", "s3://", "file://relative/dir", "s3://B/x", "/abs/dir"])
def test_open_store_refuses_what_is_no_store_url(url):
    with pytest.raises(ValueError, match="not a fleet store URL"):
        open_store(url, timeout=1)


def test_the_s3_store_is_named_by_bucket_and_prefix(s3_url):
    store = open_store(s3_url + "/", timeout=1)
    assert store.url == s3_url and repr(store) == f"S3Store({s3_url!r})"


def test_a_sparse_entry_goes_up_to_s3_in_whole_parts(s3_url, monkeypatch):
    """A reader that returns one data extent at a time must still make every part whole (S3 refuses parts
    under 5 MiB but the last)."""
    from overmind.fleet.extents import ExtentReader, data_extents

    monkeypatch.setattr(S3Store, "multipart_above", 6 << 20)
    monkeypatch.setattr(S3Store, "part_size", 5 << 20)
    fd = os.memfd_create("arena")
    os.ftruncate(fd, 64 << 20)
    for i in range(16):  # 16 extents of 1 MiB, 3 MiB apart
        os.pwrite(fd, os.urandom(1 << 20), i * (4 << 20))
    runs = data_extents(fd, 64 << 20)
    assert len(runs) == 16
    packed = b"".join(os.pread(fd, n, o) for o, n in runs)
    digest = hashlib.sha256(packed).hexdigest()
    store = open_store(s3_url, timeout=10)
    store.put_blob(digest, ExtentReader(fd, runs), len(packed))
    with store.open_blob(digest) as stream:
        assert stream.read() == packed
    os.close(fd)
