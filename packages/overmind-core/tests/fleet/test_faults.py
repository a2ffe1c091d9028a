"""The store's faults: an upload killed half-way, or failing between its blobs and its ref, leaves nothing to
import; two uploads of one entry at once both succeed; a store that is down or stalled raises StoreError within
the fleet timeout's few seconds, never hangs."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from _support import pythonpath_env
from _support.seaweed import closed_endpoint
from overmind.fleet.config import open_store
from overmind.fleet.errors import StoreError
from overmind.fleet.transfer import digest_of, download, upload

PKEY = hashlib.sha256(b"an entry").hexdigest()
TIMEOUT = 2.0

UPLOADER = r"""
import os, sys, time
from overmind.fleet import extents, transfer
from overmind.fleet.config import open_store

def readinto(self, buffer, _plain=extents.ExtentReader.readinto):
    n = _plain(self, buffer)
    if self._size > 1 << 20 and self._pos > self._size // 2:
        print("half", flush=True)
        time.sleep(60)
    return n

extents.ExtentReader.readinto = readinto
small, big = os.memfd_create("small"), os.memfd_create("big")
os.write(small, b"a small entry")
os.ftruncate(big, 64 << 20)
os.pwrite(big, os.urandom(8 << 20), 1 << 20)  # data in a sparse memfd: only the data travels
transfer.upload(open_store(sys.argv[1], 10), b"k" * 32, sys.argv[2], {"stack": 1}, "e1", {}, small,
                [("e0", big, "entry")])
print("done", flush=True)
"""


def test_an_upload_killed_half_way_leaves_nothing_to_import(store_url):
    proc = subprocess.Popen([sys.executable, "-c", UPLOADER, store_url, PKEY], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": pythonpath_env()})
    try:
        assert proc.stdout.readline() == "half\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = open_store(store_url, TIMEOUT)
    assert store.refs() == [] and store.get_ref(PKEY) is None
    assert download(store, b"k" * 32, PKEY, {"stack": 1}) is None
    assert store.has_blob(hashlib.sha256(b"a small entry").hexdigest())  # the blob before: whole


def test_an_upload_failing_before_its_ref_leaves_nothing_to_import(store, fleet_key, stack, monkeypatch):
    fd = os.memfd_create("main")
    os.write(fd, b"main")

    def fail(*args):
        raise StoreError(store.url, "the disk is full")

    monkeypatch.setattr(store, "put_ref", fail)
    with pytest.raises(StoreError, match="full"):
        upload(store, fleet_key, PKEY, stack, "e1", {}, fd, [])
    assert store.has_blob(digest_of(fd)[0])
    assert download(store, fleet_key, PKEY, stack) is None
    os.close(fd)


def test_two_uploads_of_one_entry_at_once_both_succeed(store_url, fleet_key, stack):
    data = os.urandom(8 << 20)
    fds = [os.memfd_create("main") for _ in range(2)]
    for fd in fds:
        os.write(fd, data)
    start = threading.Barrier(2)
    results: list = []

    def run(fd: int) -> None:
        store = open_store(store_url, 10)
        start.wait()
        try:
            results.append(upload(store, fleet_key, PKEY, stack, "e1", {"n": 1}, fd, []))
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            results.append(exc)

    threads = [threading.Thread(target=run, args=(fd,)) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, int) for r in results), results
    got = download(open_store(store_url, 10), fleet_key, PKEY, stack)
    assert os.pread(got.main[1], len(data) + 1, 0) == data
    got.close()
    for fd in fds:
        os.close(fd)


def _every_operation(store) -> list:
    fd = os.memfd_create("main")
    os.write(fd, b"main")
    return [lambda: store.get_ref(PKEY), lambda: store.has_blob(PKEY), lambda: store.refs(),
            lambda: store.put_ref(PKEY, b"x"), lambda: store.open_blob(PKEY),
            lambda: download(store, b"k" * 32, PKEY, {}), lambda: upload(store, b"k" * 32, PKEY, {}, "e1", {}, fd, [])]


def test_a_store_that_is_down_raises_store_error_at_once(seaweed, monkeypatch):
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed_endpoint())
    store = open_store("s3://overmind/down", TIMEOUT)
    for operation in _every_operation(store):
        began = time.monotonic()
        with pytest.raises(StoreError, match="s3://overmind/down.*AWS_ENDPOINT_URL"):
            operation()
        assert time.monotonic() - began < TIMEOUT


def test_a_stalled_store_raises_store_error_within_its_timeout(seaweed, s3_url):
    store = open_store(s3_url, TIMEOUT)
    store.put_ref(PKEY, b"there")
    with seaweed.paused():
        for operation in _every_operation(store)[:2]:
            began = time.monotonic()
            with pytest.raises(StoreError, match="Timeout"):
                operation()
            assert time.monotonic() - began < 2 * TIMEOUT + 2  # two attempts, a backoff under a second
    assert store.get_ref(PKEY) == b"there"


def test_a_directory_store_that_cannot_be_written_says_so(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    store = open_store(f"file://{tmp_path}/file/fleet", TIMEOUT)
    with pytest.raises(StoreError, match=f"file://{tmp_path}/file/fleet.*writable"):
        store.put_ref(PKEY, b"x")
    with pytest.raises(StoreError, match="cannot list refs"):
        store.refs()
