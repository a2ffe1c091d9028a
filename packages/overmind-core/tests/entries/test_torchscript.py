"""TorchScript modules through overmind.entries.torchscript's reducer and a sealed copy-on-write memfd, on both
zero-copy implementations (compiled ``overmind.native._C`` and the pure-Python twin: the ``impl`` fixture, in
conftest.py).

The path under test is the cache's: reduce -> archive storage -> bytes into a sealed memfd -> map it
ACCESS_COPY -> ``storage_from_buffer`` -> ``rebuild_script_module``.
"""
from __future__ import annotations

import ctypes
import fcntl
import gc
import io
import mmap
import os
import pickle
import struct
import weakref
import zipfile

import pytest
import torch
from torch import nn

from _support.script_models import EXAMPLE, MODELS, scripted, traced
from overmind.entries import torchscript
from overmind.native import zerocopy

# torch 2.13 deprecates the TorchScript front end (script, trace, save, load); the tests use it on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*is deprecated:DeprecationWarning")

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
DATA_OFFSET = 4096  # where the cache's entry layout puts storages: page aligned, after header and skeleton


# --- the cache's path, in miniature ------------------------------------------------------------------


def storage_bytes(storage: torch.UntypedStorage) -> bytes:
    return ctypes.string_at(storage.data_ptr(), storage.nbytes())


def publish(storage: torch.UntypedStorage) -> int:
    """Write an archive storage into a memfd at DATA_OFFSET and seal it, as the cache writer does."""
    fd = os.memfd_create("overmind-test", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    os.pwrite(fd, storage_bytes(storage), DATA_OFFSET)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def borrow(fd: int, nbytes: int) -> tuple[mmap.mmap, torch.UntypedStorage]:
    """Map a published entry copy-on-write and view the archive in it, as the cache reader does."""
    mm = mmap.mmap(fd, DATA_OFFSET + nbytes, access=mmap.ACCESS_COPY)
    return mm, zerocopy.storage_from_buffer(memoryview(mm)[DATA_OFFSET : DATA_OFFSET + nbytes])


def address_range(storage: torch.UntypedStorage) -> range:
    return range(storage.data_ptr(), storage.data_ptr() + storage.nbytes())


def tensors_of(module: torch.jit.ScriptModule) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def round_trip(module: torch.jit.ScriptModule):
    """Reduce, publish, borrow, rebuild: returns (rebuilt module, mapping, mapped archive storage, fd)."""
    rebuild, (archive, device) = torchscript.reducers()[torch.jit.ScriptModule](module)
    fd = publish(archive)
    mm, mapped = borrow(fd, archive.nbytes())
    return rebuild(mapped, device), mm, mapped, fd


# --- the reducer ---------------------------------------------------------------------------------------


def test_reducer_table_covers_scripted_and_traced_modules():
    table = torchscript.reducers()
    assert set(table) == {torch.jit.ScriptModule}
    # The pickler looks reducers up along the MRO: these are the classes script() and trace() return.
    assert isinstance(scripted(), torch.jit.ScriptModule)
    assert isinstance(traced(), torch.jit.ScriptModule)
    assert issubclass(torch.jit.RecursiveScriptModule, torch.jit.ScriptModule)
    assert issubclass(torch.jit.TopLevelTracedModule, torch.jit.ScriptModule)


def test_reduction_is_a_rebuild_function_and_an_archive_storage():
    rebuild, args = torchscript.reduce_script_module(scripted())
    assert rebuild is torchscript.rebuild_script_module
    archive, device = args
    assert isinstance(archive, torch.UntypedStorage) and archive.device.type == "cpu"
    assert device == "cpu"
    assert storage_bytes(archive)[:4] == b"PK\x03\x04"


def test_tensor_records_are_stored_uncompressed_at_aligned_offsets():
    """Aliasing needs each tensor record's bytes contiguous and aligned in the archive."""
    module = traced()
    data = storage_bytes(torchscript.archive_storage(module))
    archive = zipfile.ZipFile(io.BytesIO(data))
    records = [info for info in archive.infolist() if info.filename.endswith(".storage")]
    assert len(records) == len(tensors_of(module)) + 1  # parameters and buffers, plus the traced constant
    for info in records:
        assert info.compress_type == zipfile.ZIP_STORED, info.filename
        name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
        start = info.header_offset + 30 + name_len + extra_len
        assert start % 64 == 0, info.filename
        assert data[start : start + info.file_size] == archive.read(info)


# --- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
def test_round_trip_gives_identical_outputs(impl, kind):
    original = MODELS[kind]()
    rebuilt, mm, mapped, fd = round_trip(original)
    try:
        assert isinstance(rebuilt, torch.jit.ScriptModule)
        with torch.no_grad():
            assert torch.equal(rebuilt(EXAMPLE), original(EXAMPLE))
        expected = original.state_dict()
        got = rebuilt.state_dict()
        assert list(got) == list(expected)
        assert all(torch.equal(got[k], expected[k]) and got[k].dtype == expected[k].dtype for k in expected)
        assert rebuilt.code == original.code
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", MODELS)
def test_compiled_import_aliases_tensor_records_and_twin_copies(impl, kind):
    rebuilt, mm, mapped, fd = round_trip(MODELS[kind]())
    os.close(fd)
    inside = [t.data_ptr() in address_range(mapped) for t in tensors_of(rebuilt)]
    assert inside
    if impl == "c":
        assert all(inside), "every parameter and buffer must point into the mapped archive"
    else:
        assert not any(inside), "the twin documents that it copies tensor records"


def test_round_trip_through_pickle_with_storages_out_of_band(impl):
    """The reduction survives a real pickler that keeps storages out of band, as entries/pickling.py does."""
    table = torchscript.reducers()
    out_of_band: list[torch.UntypedStorage] = []

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            for cls in type(obj).__mro__:
                if cls in table:
                    return table[cls](obj)
            return NotImplemented

        def persistent_id(self, obj):
            if isinstance(obj, torch.UntypedStorage):
                out_of_band.append(obj)
                return ("storage", len(out_of_band) - 1)
            return None

    original = {"model": scripted(), "note": "hello"}
    stream = io.BytesIO()
    Pickler(stream, protocol=5).dump(original)
    (archive,) = out_of_band
    fd = publish(archive)
    mm, mapped = borrow(fd, archive.nbytes())
    os.close(fd)

    unpickler = pickle.Unpickler(io.BytesIO(stream.getvalue()))
    unpickler.persistent_load = lambda pid: mapped
    loaded = unpickler.load()
    assert loaded["note"] == "hello"
    with torch.no_grad():
        assert torch.equal(loaded["model"](EXAMPLE), original["model"](EXAMPLE))


def test_round_trip_through_the_core_pickler(impl):
    """overmind.entries.pickling with this module's reducers: the module is one out-of-band storage, and the
    unpickler hands rebuild_script_module the TypedStorage(uint8) wrapper it gives every storage."""
    from overmind.entries import pickling

    original = {"encoder": traced(), "decoder": scripted()}
    pickled = pickling.dumps(original, reducers=torchscript.reducers(), reference_mapped=False)
    assert len(pickled.storages) == 2  # one archive per module, nothing else
    region = bytearray(pickled.data_len)
    for storage, offset in pickled.storages:
        region[offset : offset + storage.nbytes()] = storage_bytes(storage)
    fd = publish(zerocopy.storage_from_buffer(region))
    mm, data = borrow(fd, len(region))
    os.close(fd)

    def storage_source(where, offset, nbytes):
        assert where is None
        return zerocopy.storage_from_buffer(memoryview(mm)[DATA_OFFSET + offset : DATA_OFFSET + offset + nbytes])

    loaded = pickling.loads(pickled.skeleton, storage_source, pickled.pickler)
    with torch.no_grad():
        for name, module in original.items():
            assert torch.equal(loaded[name](EXAMPLE), module(EXAMPLE))
            inside = {t.data_ptr() in address_range(data) for t in tensors_of(loaded[name])}
            assert inside == {impl == "c"}


# --- copy-on-write, lifetime, re-saving -----------------------------------------------------------------


def test_in_place_writes_to_rebuilt_weights_stay_private(impl):
    original = scripted()
    with torch.no_grad():
        expected = original(EXAMPLE)
    rebuilt, mm, mapped, fd = round_trip(original)
    with torch.no_grad():
        for tensor in tensors_of(rebuilt):
            if tensor.is_floating_point():
                tensor.add_(1.0)
        assert not torch.equal(rebuilt(EXAMPLE), expected)
    # Another process's view of the same sealed entry: a fresh mapping of the memfd.
    other_mm, other = borrow(fd, mapped.nbytes())
    os.close(fd)
    again = torchscript.rebuild_script_module(other, "cpu")
    with torch.no_grad():
        assert torch.equal(again(EXAMPLE), expected)


def test_rebuilt_module_keeps_the_mapping_alive_only_while_it_needs_it(impl):
    original = scripted()
    rebuilt, mm, mapped, fd = round_trip(original)
    os.close(fd)
    alive = weakref.ref(mm)
    del mm, mapped
    gc.collect()
    # The compiled import aliases the mapping (so it must stay); the twin copied it (so it must go).
    assert (alive() is not None) == (impl == "c")
    with torch.no_grad():
        assert torch.equal(rebuilt(EXAMPLE), original(EXAMPLE))
    del rebuilt
    gc.collect()
    assert alive() is None


def test_module_mapped_from_shared_memory_can_be_saved_again(impl):
    """A rebuilt module's tensors live in the (copy-on-write) mapping; serializing them must work."""
    original = traced()
    rebuilt, mm, mapped, fd = round_trip(original)
    os.close(fd)
    again, mm2, mapped2, fd2 = round_trip(rebuilt)
    os.close(fd2)
    stream = io.BytesIO()
    torch.jit.save(rebuilt, stream)
    stream.seek(0)
    reloaded = torch.jit.load(stream)
    with torch.no_grad():
        expected = original(EXAMPLE)
        assert torch.equal(again(EXAMPLE), expected)
        assert torch.equal(reloaded(EXAMPLE), expected)


# --- script_module_from_storage on its own -------------------------------------------------------------


@pytest.mark.parametrize("map_location", [None, "cpu", torch.device("cpu")])
def test_plain_jit_save_archives_load_too(impl, map_location):
    original = traced()
    stream = io.BytesIO()
    torch.jit.save(original, stream)
    storage = zerocopy.storage_from_buffer(bytearray(stream.getvalue()))
    loaded = zerocopy.script_module_from_storage(storage, map_location=map_location)
    with torch.no_grad():
        assert torch.equal(loaded(EXAMPLE), original(EXAMPLE))


def test_map_location_moves_tensors(impl):
    archive = torchscript.archive_storage(scripted())
    loaded = zerocopy.script_module_from_storage(archive, map_location="meta")
    assert {t.device.type for t in tensors_of(loaded)} == {"meta"}


def test_bad_inputs_are_refused_alike(impl):
    with pytest.raises(RuntimeError):
        zerocopy.script_module_from_storage(zerocopy.storage_from_buffer(bytearray(b"not a zip archive" * 8)))
    with pytest.raises(ValueError, match="CPU storage"):
        zerocopy.script_module_from_storage(torch.UntypedStorage(64, device="meta"))
    with pytest.raises(TypeError, match="UntypedStorage"):
        zerocopy.script_module_from_storage(b"PK\x03\x04")


# --- no copy of the archive, measured as memory --------------------------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


class Wide(nn.Module):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight[:4].sum()


def test_peak_memory_of_an_import_shows_what_is_copied(impl):
    """The compiled import neither copies the archive nor its records: importing a 32 MiB archive raises
    the process's peak RSS by far less than the archive; the twin's copies raise it by more than that."""
    try:
        _reset_peak_rss()
    except OSError as exc:
        pytest.skip(f"cannot reset the peak RSS here ({exc})")
    archive_size = 32 << 20
    fd = publish(torchscript.archive_storage(torch.jit.script(Wide(archive_size // 4))))
    nbytes = os.fstat(fd).st_size - DATA_OFFSET
    mm, mapped = borrow(fd, nbytes)
    os.close(fd)
    zerocopy.script_module_from_storage(torchscript.archive_storage(torch.jit.script(Wide(4))))  # warm-up
    gc.collect()
    _reset_peak_rss()
    before = _status_bytes("VmRSS")
    loaded = zerocopy.script_module_from_storage(mapped)
    growth = _status_bytes("VmHWM") - before
    assert loaded.weight.numel() == archive_size // 4
    if impl == "c":
        assert growth < archive_size // 4, f"peak RSS grew {growth >> 20} MiB for a {archive_size >> 20} MiB archive"
    else:
        assert growth > archive_size, f"the twin copies; peak RSS grew only {growth >> 20} MiB"
