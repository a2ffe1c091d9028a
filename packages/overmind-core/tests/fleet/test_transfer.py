"""An entry goes up from its fds and comes down into sealed, sparse memfds equal byte for byte, on both stores;
a blob changed, cut short or gone in the store is refused and leaves no fd open."""
from __future__ import annotations

import fcntl
import hashlib
import os

import pytest

from overmind.fleet.dir_store import DirStore
from overmind.fleet.errors import Refused
from overmind.fleet.extents import ExtentReader
from overmind.fleet.transfer import digest_of, download, upload
from overmind.shm import seals

PKEY = hashlib.sha256(b"an entry").hexdigest()
META = {"label": "tiny", "nbytes": 1}


def memfd(data: bytes) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    return fd


@pytest.fixture
def fds():
    """``fds(data, ...)``: memfds holding each ``data``; closed at teardown."""
    made = []

    def make(*datas: bytes) -> list[int]:
        made.extend(memfd(d) for d in datas)
        return made[-len(datas):]

    yield make
    for fd in made:
        os.close(fd)


def content(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size + 1, 0)


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def put_raw(store, digest: str, data: bytes) -> None:
    """Replace the bytes of blob ``digest`` in the store behind its back."""
    if isinstance(store, DirStore):
        path = os.path.join(store.root, "blobs/sha256", digest)
        os.chmod(path, 0o644)
        with open(path, "wb") as f:
            f.write(data)
    else:
        store._client.put_object(Bucket=store.bucket, Key=f"{store.prefix}blobs/sha256/{digest}", Body=data)


def test_an_entry_round_trips_into_sealed_memfds(store, fleet_key, stack, fds):
    main, dep, file = fds(os.urandom(200_000), os.urandom(70_000), b"a referenced file")
    sent = upload(store, fleet_key, PKEY, stack, "e1", META, main, [("e0", dep, "entry"), ("f0", file, "file")])
    assert sent == 200_000 + 70_000 + len(b"a referenced file")
    got = download(store, fleet_key, PKEY, stack)
    try:
        assert got.main[0] == "e1" and content(got.main[1]) == content(main)
        assert [(e, k) for e, _, k in got.deps] == [("e0", "entry"), ("f0", "file")]
        assert [content(fd) for _, fd, _ in got.deps] == [content(dep), content(file)]
        for fd in [got.main[1], *(d[1] for d in got.deps)]:
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals.APPLIED == seals.APPLIED
        assert got.manifest["meta"] == META and got.manifest["stack"] == stack
    finally:
        got.close()
    assert upload(store, fleet_key, PKEY, stack, "e1", META, main, [("e0", dep, "entry")]) == 0  # all there


def test_no_entry_is_none(store, fleet_key, stack):
    assert download(store, fleet_key, PKEY, stack) is None


def test_a_mostly_zero_blob_comes_down_sparse(store, fleet_key, stack, fds):
    data = bytearray(32 << 20)
    data[5 << 20:(5 << 20) + 100] = os.urandom(100)
    data[-1] = 7
    (main,) = fds(bytes(data))
    upload(store, fleet_key, PKEY, stack, "e1", META, main, [])
    got = download(store, fleet_key, PKEY, stack)
    try:
        fd = got.main[1]
        assert content(fd) == bytes(data)
        assert os.fstat(fd).st_blocks * 512 <= 1 << 20, os.fstat(fd).st_blocks
        assert os.fstat(main).st_blocks * 512 >= 32 << 20
    finally:
        got.close()


def test_the_same_bytes_twice_go_up_once_and_come_down_twice(store, fleet_key, stack, fds):
    same = os.urandom(10_000)
    main, a, b = fds(b"main", same, same)
    assert upload(store, fleet_key, PKEY, stack, "e1", META, main, [("a", a, "entry"), ("b", b, "entry")]) == 10_004
    got = download(store, fleet_key, PKEY, stack)
    try:
        assert [content(fd) for _, fd, _ in got.deps] == [same, same]
        assert got.deps[0][1] != got.deps[1][1]  # two fds: the caller closes each
    finally:
        got.close()


def test_an_empty_blob_round_trips(store, fleet_key, stack, fds):
    (main,) = fds(b"")
    upload(store, fleet_key, PKEY, stack, "e1", META, main, [])
    got = download(store, fleet_key, PKEY, stack)
    assert content(got.main[1]) == b""
    got.close()


@pytest.mark.parametrize("change,reason", [
    (lambda b: b[:1000] + bytes([b[1000] ^ 1]) + b[1001:], "digest"),
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0", "truncated"),
    (lambda b: b[:100_000], "truncated"),
])
def test_a_damaged_blob_is_refused_and_no_fd_stays_open(store, fleet_key, stack, fds, change, reason):
    main, dep = fds(os.urandom(1000), os.urandom(300_000))
    upload(store, fleet_key, PKEY, stack, "e1", META, main, [("e0", dep, "entry")])
    digest, _ = digest_of(dep)
    put_raw(store, digest, change(content(dep)))
    before = open_fds()
    with pytest.raises(Refused, match=digest) as caught:
        download(store, fleet_key, PKEY, stack)
    assert caught.value.reason == reason and store.url in str(caught.value)
    assert open_fds() <= before


def test_a_missing_blob_is_refused(tmp_path, fleet_key, stack, fds):
    store = DirStore(str(tmp_path))
    main, dep = fds(b"main", b"dep")
    upload(store, fleet_key, PKEY, stack, "e1", META, main, [("e0", dep, "entry")])
    os.unlink(tmp_path / "blobs/sha256" / digest_of(dep)[0])
    with pytest.raises(Refused) as caught:
        download(store, fleet_key, PKEY, stack)
    assert caught.value.reason == "missing"


def test_an_entry_for_another_stack_is_refused_before_any_blob_is_read(tmp_path, fleet_key, stack, fds):
    store = DirStore(str(tmp_path))
    (main,) = fds(b"main")
    upload(store, fleet_key, PKEY, stack, "e1", META, main, [])
    os.unlink(tmp_path / "blobs/sha256" / digest_of(main)[0])
    with pytest.raises(Refused) as caught:
        download(store, fleet_key, PKEY, {**stack, "python": "3.12.1 cpython"})
    assert caught.value.reason == "foreign"
    with pytest.raises(Refused) as caught:
        download(store, b"another key of the fleet", PKEY, stack)
    assert caught.value.reason == "signature"


def test_extent_reader_reads_with_pread_across_extents_and_leaves_the_offset(fds):
    (fd,) = fds(b"0123456789")
    os.lseek(fd, 3, os.SEEK_SET)
    reader = ExtentReader(fd, [(0, 3), (5, 5)])  # "012" then "56789"
    assert reader.read(5) == b"01256" and reader.read() == b"789" and reader.read() == b""
    assert reader.seek(-2, 2) == 6 and reader.read() == b"89" and reader.seek(1) == 1 and reader.tell() == 1
    assert os.lseek(fd, 0, os.SEEK_CUR) == 3


def test_a_sparse_memfd_travels_as_its_data_only(store, fleet_key, stack):
    fd = os.memfd_create("arena", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 256 << 20)  # a load arena reserves more than its loader fills
    pieces = {0: os.urandom(4096), 64 << 20: os.urandom(1 << 20), (256 << 20) - 4096: os.urandom(4096)}
    for offset, piece in pieces.items():
        os.pwrite(fd, piece, offset)
    sent = upload(store, fleet_key, PKEY, stack, "e1", META, fd, [])
    assert sent <= 2 << 20  # the data, not the 256 MiB it spans
    got = download(store, fleet_key, PKEY, stack)
    try:
        here = got.main[1]
        assert os.fstat(here).st_size == 256 << 20
        assert all(os.pread(here, len(piece), offset) == piece for offset, piece in pieces.items())
        assert os.pread(here, 4096, 128 << 20) == bytes(4096)
        assert os.fstat(here).st_blocks * 512 <= 4 << 20
        assert fcntl.fcntl(here, fcntl.F_GET_SEALS) & seals.REQUIRED == seals.REQUIRED
    finally:
        got.close()
        os.close(fd)
