"""File entries: storages that are untouched private mappings of a checkpoint file are referenced in
the file, not copied into a memfd, and a hit is never served from a file that changed since.

The loader here reads a safetensors file the way transformers and diffusers do for an fp16 checkpoint loaded
without conversion: one ``MAP_PRIVATE`` mapping of the file, every tensor ``torch.frombuffer`` over it. Real
servers (``overmind_runtime``), real files, real mappings; ``/proc/self/maps`` tells where a storage lies.
"""
from __future__ import annotations

import json
import mmap
import os
import struct

import pytest
import torch

import overmind
from overmind.client.connection import Client
from overmind.entries import codec as entry_mod
from overmind.errors import ServerError
from overmind.inspection import cache_info
from overmind.ipc.protocol import file_entry_id, file_identity
from overmind.shm import filemaps, mappings, writer
from overmind.shm.placer import Placer
from overmind.shm.reader import FileMapping
from overmind.testing import clear_calls, mapped_path, record_call, recorded_calls, run_fresh

CALLS = "file-entries"
N = 65536  # floats per tensor: 256 KiB each, far above an entry's skeleton
_DTYPES = {"F32": torch.float32, "F16": torch.float16}


# ---- a checkpoint file and a lazy loader of it ---------------------------------------------------------
def write_checkpoint(path: str, seed: int) -> None:
    """A safetensors file of three float32 tensors (a, b, c) and one float16 (d), values from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"a": torch.randn(N, generator=g), "b": torch.randn(N, generator=g), "c": torch.randn(N, generator=g),
               "d": torch.randn(2 * N, generator=g).half()}
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32" if t.dtype == torch.float32 else "F16", "shape": list(t.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def private_mapping(path) -> mmap.mmap:
    """A private (copy-on-write) mapping of the whole file, as a lazy safetensors load makes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def load_checkpoint(path, edit=None):
    """Every tensor of ``path`` zero-copy over one private mapping of it (a lazy safetensors load).

    ``edit``: ``"write"`` adds 1 to part of ``b`` in place, ``"half"`` converts ``c`` to float16, ``"view"`` returns
    ``d`` as two views and writes the second (its storage partly dirty), ``"all"`` does the three."""
    record_call(path, CALLS)
    mm = private_mapping(path)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(bytes(mm[8:8 + n]))
    out = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        lo, hi = info["data_offsets"]
        count = (hi - lo) // torch.empty(0, dtype=dtype).element_size()
        out[name] = torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + lo).view(info["shape"])
    if edit in ("write", "all"):
        out["b"][N // 2:N // 2 + 10].add_(1)  # pages in its middle: its neighbours' pages stay clean
    if edit in ("half", "all"):
        out["c"] = out["c"].half()
    if edit in ("view", "all"):
        d = out.pop("d")
        out["d1"], out["d2"] = d[:N], d[N:]
        out["d2"].mul_(2)
    return out


def load_from_env():
    """The same load, of the file ``$OVERMIND_TEST_CHECKPOINT``: the environment is not part of a key, so
    only the server's check of the file stands between a changed file and a stale hit."""
    return load_checkpoint(os.environ["OVERMIND_TEST_CHECKPOINT"])


def mapped_file(ptr: int) -> str:
    """What the mapping holding ``ptr`` maps: a path, ``/memfd:...``, or "" (anonymous)."""
    name = mapped_path(ptr)
    if name is None:
        raise AssertionError(f"{ptr:#x} is not mapped")
    return name


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert type(got[name]) is type(want[name]) and got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name


def only_entry():
    info = cache_info(processes=False)
    assert len(info.entries) == 1, info.entries
    return info.entries[0], info


@pytest.fixture
def checkpoint(tmp_path):
    path = str(tmp_path / "model.safetensors")
    write_checkpoint(path, seed=1)
    clear_calls(CALLS)
    return path


@pytest.fixture
def env_checkpoint(checkpoint, monkeypatch):
    monkeypatch.setenv("OVERMIND_TEST_CHECKPOINT", checkpoint)
    return checkpoint


# ---- referenced, not copied ----------------------------------------------------------------------------
def test_a_hit_references_the_checkpoint_file_and_holds_no_copy_of_its_bytes(overmind_runtime, checkpoint):
    plain = load_checkpoint(checkpoint)
    first = overmind.load(load_checkpoint, checkpoint)
    hit = overmind.load(load_checkpoint, checkpoint)
    assert len(recorded_calls(CALLS)) == 2  # the plain call and the miss; the third was a hit
    assert_same(first, plain)
    assert_same(hit, plain)
    for t in list(hit.values()) + list(first.values()):
        assert mapped_file(t.untyped_storage().data_ptr()) == checkpoint
    entry, info = only_entry()
    size = os.path.getsize(checkpoint)
    assert entry.nbytes < 64 * 1024 < size, "the tensors' bytes must not be in the entry's memfd"
    assert [f.path for f in entry.files] == [checkpoint] and entry.file_nbytes == size
    assert [(f.path, f.nbytes, f.referenced_by) for f in info.files] == [(checkpoint, size, (entry.entry_id,))]
    assert info.status["files"] == 1 and info.status["file_bytes"] == size
    assert info.status["bytes"] == entry.nbytes, "file bytes are page cache, not counted in the budget"
    assert entry.to_json()["file_nbytes"] == size and info.to_json()["file_bytes"] == size
    from overmind.cli.listing import render

    total = render(info.entries, width=200)[-1]
    assert total.startswith("1 entry: ") and "in 1 checkpoint file referenced (page cache)" in total, total


def test_in_place_writes_to_a_hit_stay_private(overmind_runtime, checkpoint):
    with open(checkpoint, "rb") as f:
        on_disk = f.read()
    overmind.load(load_checkpoint, checkpoint)
    hit = overmind.load(load_checkpoint, checkpoint)
    hit["a"].add_(100)
    again = overmind.load(load_checkpoint, checkpoint)
    assert_same(again, load_checkpoint(checkpoint))
    with open(checkpoint, "rb") as f:
        assert f.read() == on_disk, "a write to a hit must never reach the file"


def test_setting_off_copies_as_before(overmind_runtime, checkpoint, monkeypatch):
    monkeypatch.setenv("OVERMIND_FILE_REFERENCES", "0")
    overmind.load(load_checkpoint, checkpoint)
    hit = overmind.load(load_checkpoint, checkpoint)
    assert_same(hit, load_checkpoint(checkpoint))
    assert all(mapped_file(t.untyped_storage().data_ptr()).startswith("/memfd:overmind") for t in hit.values())
    entry, info = only_entry()
    assert entry.nbytes > os.path.getsize(checkpoint) - 4096 and not entry.files and not info.files


# ---- only clean file pages are referenced ----------------------------------------------------------------
def test_written_converted_and_partly_dirty_storages_are_copied_the_rest_referenced(overmind_runtime, checkpoint):
    plain = load_checkpoint(checkpoint, "all")
    overmind.load(load_checkpoint, checkpoint, "all")
    hit = overmind.load(load_checkpoint, checkpoint, "all")
    assert_same(hit, plain)
    where = {name: mapped_file(t.untyped_storage().data_ptr()) for name, t in hit.items()}
    assert where["a"] == checkpoint, "an untouched tensor is referenced in the file"
    for name in ("b", "c", "d1", "d2"):  # written in place, converted, a view of a partly written storage
        assert where[name].startswith("/memfd:overmind"), (name, where[name])
    assert hit["d1"].untyped_storage().data_ptr() == hit["d2"].untyped_storage().data_ptr(), "views stay views"
    entry, _ = only_entry()
    assert [f.path for f in entry.files] == [checkpoint]
    copied = plain["b"].nbytes + plain["c"].nbytes + plain["d1"].nbytes + plain["d2"].nbytes  # (d: one storage)
    assert copied <= entry.nbytes < copied + 64 * 1024


# ---- the file changes ------------------------------------------------------------------------------------
def test_replaced_by_rename_gets_a_new_entry_and_the_old_object_keeps_its_values(overmind_runtime, checkpoint):
    old = overmind.load(load_checkpoint, checkpoint)
    old_values = {k: v.clone() for k, v in old.items()}
    old_entry, _ = only_entry()
    write_checkpoint(checkpoint + ".tmp", seed=2)
    os.replace(checkpoint + ".tmp", checkpoint)
    new = overmind.load(load_checkpoint, checkpoint)
    assert len(recorded_calls(CALLS)) == 2
    assert_same(new, load_checkpoint(checkpoint))
    assert_same(old, old_values)  # the old inode lives on while it is mapped, as with a plain lazy load
    assert not torch.equal(old["a"], new["a"])
    # The old entry's file is gone (renamed over): a get of its key is not answered from it.
    client = Client(autostart=False)
    assert client.get(old_entry.key, claim=False, wait=False).status == "miss"
    info = cache_info(processes=False)
    assert [e.key for e in info.entries] != [old_entry.key] and len(info.files) == 1
    assert info.files[0].entry_id == file_entry_id(file_identity(os.stat(checkpoint)))


def test_a_deleted_checkpoint_is_never_served(overmind_runtime, env_checkpoint):
    overmind.load(load_from_env)
    os.unlink(env_checkpoint)
    with pytest.raises(FileNotFoundError):
        load_from_env()
    with pytest.raises(FileNotFoundError):  # as plain: the key is the same, the entry must not answer
        overmind.load(load_from_env)
    assert cache_info(processes=False).entries == ()


@pytest.mark.parametrize("mtime", ["new", "put back"])
def test_a_checkpoint_rewritten_in_place_is_never_served_stale(overmind_runtime, env_checkpoint, mtime):
    overmind.load(load_from_env)
    before = os.stat(env_checkpoint)
    write_checkpoint(env_checkpoint + ".new", seed=3)
    with open(env_checkpoint + ".new", "rb") as src, open(env_checkpoint, "r+b") as dst:
        dst.write(src.read())  # same size, same inode
    if mtime == "put back":
        os.utime(env_checkpoint, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(env_checkpoint)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert after.st_ctime_ns != before.st_ctime_ns
    got = overmind.load(load_from_env)
    assert len(recorded_calls(CALLS)) == 2, "the changed file must be loaded again, not served"
    assert_same(got, load_checkpoint(env_checkpoint))
    hit = overmind.load(load_from_env)  # and the republished entry serves the new bytes
    assert len(recorded_calls(CALLS)) == 3
    assert_same(hit, load_checkpoint(env_checkpoint))


@pytest.mark.parametrize("when", ["before the fds are opened", "after the fds are opened"])
def test_a_file_changing_during_the_publish_is_copied_instead(overmind_runtime, env_checkpoint, monkeypatch, when):
    real = filemaps.open_referenced

    def touch_then_open(deps):
        if when == "after the fds are opened":
            files = real(deps)
            os.utime(env_checkpoint, ns=(1, 1))  # the server's fstat will not match what the client saw
            return files
        os.utime(env_checkpoint, ns=(1, 1))
        return real(deps)

    monkeypatch.setattr(entry_mod.filemaps, "open_referenced", touch_then_open)
    got = overmind.load(load_from_env)
    assert_same(got, load_checkpoint(env_checkpoint))
    assert all(mapped_file(t.untyped_storage().data_ptr()).startswith("/memfd:overmind") for t in got.values())
    entry, info = only_entry()
    assert not entry.files and not info.files and entry.nbytes > os.path.getsize(env_checkpoint) - 4096


def test_the_server_refuses_a_file_that_is_not_the_one_described(overmind_runtime, checkpoint):
    client = Client()
    ident = file_identity(os.stat(checkpoint))
    cases = [("file changed", dict(ident, mtime_ns=ident["mtime_ns"] + 1), os.O_RDONLY),
             ("bad request", ident, os.O_RDWR)]
    for reason, claimed, flags in cases:
        memfd = writer.write_entry(b"skeleton", [], 0)
        fd = os.open(checkpoint, flags | os.O_CLOEXEC)
        try:
            file_id = file_entry_id(claimed)
            with pytest.raises(ServerError) as err:
                client.publish_hit("f" * 40, memfd, deps=[file_id],
                                   files=[({"entry_id": file_id, "path": checkpoint, **claimed}, fd)])
            assert err.value.reason == reason, err.value
        finally:
            os.close(memfd)
            os.close(fd)
    assert client.ls_all() == {"entries": [], "files": [], "marks": []}


# ---- eviction --------------------------------------------------------------------------------------------
def random_tensors(seed):
    return {"x": torch.randn(N, generator=torch.Generator().manual_seed(seed))}


def server_fds(client: Client) -> dict[str, int]:
    """What the server's fds point at: the checkpoint files and memfds it holds, counted by kind."""
    pid = client.status()["pid"]
    counts = {"memfd": 0, "file": 0}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("/memfd:overmind"):
            counts["memfd"] += 1
        elif target.endswith(".safetensors"):
            counts["file"] += 1
    return counts


def test_evicting_frees_the_file_entry_with_its_last_referent(overmind_runtime, checkpoint):
    overmind.load(load_checkpoint, checkpoint)
    overmind.load(random_tensors, 7)
    client = Client(autostart=False)
    entries = {e.loader.rsplit(".", 1)[-1]: e for e in cache_info(processes=False).entries}
    assert server_fds(client) == {"memfd": 2, "file": 1}
    assert overmind.evict(entries["random_tensors"].key).evicted == [entries["random_tensors"].key]
    info = cache_info(processes=False)
    assert [e.key for e in info.entries] == [entries["load_checkpoint"].key] and len(info.files) == 1
    assert server_fds(client) == {"memfd": 1, "file": 1}
    assert_same(overmind.load(load_checkpoint, checkpoint), load_checkpoint(checkpoint))  # still a hit
    assert len(recorded_calls(CALLS)) == 2
    overmind.evict(entries["load_checkpoint"].key)
    info = cache_info(processes=False)
    assert info.entries == () and info.files == () and info.status["file_bytes"] == 0
    assert server_fds(client) == {"memfd": 0, "file": 0}, "the entry's memfd and the file's fd are closed"


@pytest.mark.parametrize("how", ["evict all", "marked bad"])
def test_every_way_out_of_the_cache_closes_the_file(overmind_runtime, checkpoint, how):
    overmind.load(load_checkpoint, checkpoint)
    client = Client(autostart=False)
    (entry,) = cache_info(processes=False).entries
    assert server_fds(client) == {"memfd": 1, "file": 1}
    if how == "evict all":
        assert client.evict(all=True)["evicted"] == [entry.key]
    else:
        assert client.mark_bad(entry.key, entry.entry_id)
    assert client.ls_all() == {"entries": [], "files": [], "marks": []}
    assert server_fds(client) == {"memfd": 0, "file": 0}


# ---- a file-backed hit passed on (``vae=vae``) ------------------------------------------------------------
def test_a_storage_of_a_file_backed_hit_is_placed_in_its_file_entry(checkpoint):
    fd = os.open(checkpoint, os.O_RDONLY)
    try:
        file_id = file_entry_id(file_identity(os.fstat(fd)))
        m = FileMapping(file_id, fd)
    finally:
        os.close(fd)
    storage = m.storage(4096, 8192)
    placer = Placer()
    assert placer.place(storage) == (file_id, 4096) and placer.deps == {file_id} and not placer.storages
    assert mappings.locate(storage.data_ptr(), 8192) == (file_id, 4096)
    torch.empty(0, dtype=torch.uint8).set_(storage)[0] += 1  # written: no longer the file's bytes
    written = Placer()
    assert written.place(storage) == (None, 0) and not written.deps


def test_an_entry_without_data_next_to_a_file_mapping_leaves_it_registered(checkpoint):
    """A skeleton-only entry mapped right below a file entry's mapping: its empty data region starts where the
    file's data starts (seen with a tokenizer's entry next to its model's checkpoint)."""
    fd = os.open(checkpoint, os.O_RDONLY)
    try:
        m = FileMapping(file_entry_id(file_identity(os.fstat(fd))), fd)
    finally:
        os.close(fd)
    storage = m.storage(0, 4096)

    mm = mmap.mmap(-1, 4096)  # the skeleton-only entry's mapping, right below the file's: its data region is empty
    mappings.register("skeleton-only", m.address, m.address - 4096 + len(mm), mm)
    assert mappings.locate(storage.data_ptr(), 4096) == (m.entry_id, 0)
    del mm


@pytest.mark.parametrize("name, referenced", [("lib.so", False), ("libx.so.6.0.30", False), ("model.so.bin", True),
                                              ("weights.sov", True), ("m.safetensors", True)])
def test_a_shared_librarys_mapping_is_never_a_checkpoint(tmp_path, name, referenced):
    # /proc/self/maps is read without the lines of shared libraries (~90% of them): bytes mapped from a file named as
    # a library would be copied, never referenced; any other name is looked at.
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * 64)
    private = private_mapping(path)
    t = torch.frombuffer(private, dtype=torch.uint8)
    found = filemaps.FileMaps().locate(t.data_ptr(), 4096)
    assert (found is not None) == referenced
    del t
    private.close()


def test_detection_needs_a_clean_private_mapping_of_the_file(checkpoint, tmp_path):
    import ctypes

    size = os.path.getsize(checkpoint)
    private = private_mapping(checkpoint)
    t = torch.frombuffer(private, dtype=torch.uint8)
    found = filemaps.FileMaps().locate(t.data_ptr() + 100, 5000)
    assert found is not None and found.offset == 100
    assert found.file_id == file_entry_id(file_identity(os.stat(checkpoint)))
    assert filemaps.FileMaps().locate(t.data_ptr() + size - 10, 20) is None, "past the end of the mapping"
    heap = torch.arange(5000, dtype=torch.uint8)
    assert filemaps.FileMaps().locate(heap.data_ptr(), 5000) is None
    # A shared mapping cannot tell a written page from a file page: never referenced.
    copy = str(tmp_path / "shared.bin")
    with open(copy, "wb") as f:
        f.write(b"x" * 8192)
    sfd = os.open(copy, os.O_RDWR)
    try:
        shared = mmap.mmap(sfd, 0)
    finally:
        os.close(sfd)
    probe = ctypes.c_char.from_buffer(shared)
    assert filemaps.FileMaps().locate(ctypes.addressof(probe), 4096) is None
    del probe
    shared.close()
    t[200] += 1  # one page written
    assert filemaps.FileMaps().locate(t.data_ptr(), 4096) is None
    assert filemaps.FileMaps().locate(t.data_ptr() + 8192, 4096) is not None
    other = str(tmp_path / "other.safetensors")
    write_checkpoint(other, seed=9)
    os.replace(other, checkpoint)  # the name now names another file: the mapping's file has no name
    assert filemaps.FileMaps().locate(t.data_ptr() + 8192, 4096) is None


# ---- fresh processes -------------------------------------------------------------------------------------
SCRIPT = '''
import sys, torch, overmind
sys.path.insert(0, {here!r})
from test_file_entries import load_checkpoint, mapped_file
from overmind.testing import report
got = overmind.load(load_checkpoint, {path!r}, {edit!r})
report({{name: [type(t).__name__, str(t.dtype), t.tolist(), mapped_file(t.untyped_storage().data_ptr())]
        for name, t in got.items()}})
'''


@pytest.mark.parametrize("edit", [None, "all"])
def test_fresh_processes_match_the_plain_call(overmind_runtime, checkpoint, edit):
    script = SCRIPT.format(here=os.path.dirname(__file__), path=checkpoint, edit=edit)
    first = run_fresh(script, env={"OVERMIND_STRICT": "1"})
    second = run_fresh(script, env={"OVERMIND_STRICT": "1"})
    plain = load_checkpoint(checkpoint, edit)
    for got in (first, second):
        assert sorted(got) == sorted(plain)
        for name, t in plain.items():
            assert got[name][:3] == [type(t).__name__, str(t.dtype), t.tolist()], name
    referenced = ["a", "b", "c", "d"] if edit is None else ["a"]  # "all" writes or converts the others
    assert [name for name, v in second.items() if v[3] == checkpoint] == referenced
    entry, _ = only_entry()
    assert entry.hits == 1 and [f.path for f in entry.files] == [checkpoint]


def test_overmind_status_names_the_referenced_checkpoint_bytes(overmind_runtime, checkpoint):
    import subprocess
    import sys

    overmind.load(load_checkpoint, checkpoint)
    out = subprocess.run([sys.executable, "-m", "overmind", "status"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "OVERMIND_RUNTIME_DIR": overmind_runtime})
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.split()[:1] == ["files"]]
    assert "1 checkpoint file(s) referenced" in line and "outside the budget" in line
    memory = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["memory"])
    assert "used of" in memory
