"""overmind.native.zerocopy.storage_from_buffer and the implementation switch, against both implementations.

Every behaviour test runs twice, once on the compiled ``overmind.native._C`` and once on the pure-Python twin
(the ``impl`` fixture, in conftest.py); the compiled run is skipped only when the extension does not import
here. Memory comes from real memfds sealed like cache entries (conftest's ``sealed_memfd``:
F_SEAL_WRITE|GROW|SHRINK) and mapped copy-on-write.
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
import warnings
import weakref

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overmind.native import zerocopy


def address_of(mm: mmap.mmap) -> int:
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor  # releases its export, so the mmap can still be closed


def as_bytes(storage: torch.UntypedStorage) -> bytes:
    return ctypes.string_at(storage.data_ptr(), storage.nbytes())


PATTERN = bytes(range(256)) * 48  # 12 KiB: three pages


@pytest.fixture
def mapping(sealed_memfd):
    """A copy-on-write mapping of a sealed memfd holding PATTERN, and the memfd (closed by ``sealed_memfd``)."""
    fd = sealed_memfd(PATTERN)
    mm = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    return mm, fd


# --- where the storage points ------------------------------------------------------------------------


@pytest.mark.parametrize("offset,length", [(0, len(PATTERN)), (64, 64), (4096 + 8, 5000), (len(PATTERN) - 1, 1)])
def test_data_ptr_is_the_address_inside_the_mapping(impl, mapping, offset, length):
    mm, _ = mapping
    base = address_of(mm)
    storage = zerocopy.storage_from_buffer(memoryview(mm)[offset : offset + length])
    assert storage.data_ptr() == base + offset
    assert storage.nbytes() == length
    assert storage.device.type == "cpu"
    assert as_bytes(storage) == PATTERN[offset : offset + length]


# --- a range of one view (a mapped entry's storages, shm/reader.py) -------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(-2, len(PATTERN) + 2), nbytes=st.integers(-3, len(PATTERN) + 2), whole=st.booleans())
def test_a_range_is_the_slice_it_names_or_a_clear_error(impl, sealed_memfd, offset, nbytes, whole):
    fd = sealed_memfd(PATTERN)
    mm = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    buf = mm if whole else memoryview(mm)
    end = len(PATTERN) if nbytes < 0 else offset + nbytes
    if offset < 0 or offset > len(PATTERN) or end > len(PATTERN) or end < offset:
        try:  # not pytest.raises: its kept traceback would hold the twin's view until a collection (~0.1 s each)
            zerocopy.storage_from_buffer_range(buf, offset, nbytes)
        except ValueError as e:
            assert "lie outside the buffer" in str(e)
        else:
            pytest.fail(f"no error for bytes [{offset}, +{nbytes}) of {len(PATTERN)}")
    else:
        _check_range(mm, buf, offset, end, nbytes)
    if not whole:
        buf.release()
    mm.close()  # no export is left behind, for a storage or for an error


def _check_range(mm, buf, offset, end, nbytes):
    storage = zerocopy.storage_from_buffer_range(buf, offset, nbytes)
    assert storage.nbytes() == end - offset
    if end > offset:  # an empty storage points nowhere, as storage_from_buffer's does
        assert storage.data_ptr() == address_of(mm) + offset
        assert as_bytes(storage) == PATTERN[offset:end]


def test_a_range_keeps_the_mapping_alive_and_guards_it(impl, sealed_memfd):
    fd = sealed_memfd(PATTERN)
    mm = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    os.close(fd)
    view = memoryview(mm)
    storage = zerocopy.storage_from_buffer_range(view, 4096, 100)
    with pytest.raises(BufferError):
        mm.close()
    alive = weakref.ref(mm)
    del mm, view
    gc.collect()
    assert alive() is not None, "the storage must hold the mapping"
    assert as_bytes(storage) == PATTERN[4096:4196]
    del storage
    gc.collect()
    assert alive() is None, "the mapping must be released with the last storage"


def test_whole_mmap_object_is_accepted(impl, mapping):
    mm, _ = mapping
    storage = zerocopy.storage_from_buffer(mm)
    assert storage.data_ptr() == address_of(mm)
    assert storage.nbytes() == len(PATTERN)


def test_bytearray_memory_is_shared_both_ways(impl):
    data = bytearray(b"\x00" * 32)
    storage = zerocopy.storage_from_buffer(data)
    view = torch.empty(0, dtype=torch.uint8).set_(storage)
    data[3] = 200
    view[5] = 17
    assert view[3].item() == 200
    assert data[5] == 17


# --- copy-on-write and sealing ------------------------------------------------------------------------


def test_in_place_writes_stay_private_to_the_mapping(impl, mapping):
    mm, fd = mapping
    storage = zerocopy.storage_from_buffer(memoryview(mm)[4096:8192])
    floats = torch.empty(0, dtype=torch.float32).set_(storage)
    floats.fill_(1.5)
    floats.add_(1.0)  # a second in-place kernel: read-modify-write through the same pages
    assert bytes(mm[4096:8192]) == torch.full((1024,), 2.5).numpy().tobytes()
    other = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    assert bytes(other[:]) == PATTERN
    assert os.pread(fd, len(PATTERN), 0) == PATTERN
    other.close()


def test_the_memfd_really_is_sealed(mapping):
    # Guards the test above: were the seals missing, "private" would prove nothing.
    _, fd = mapping
    with pytest.raises(PermissionError):
        mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_WRITE)
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)


# --- lifetime ---------------------------------------------------------------------------------------


def test_storage_keeps_the_mapping_alive_and_then_lets_it_go(impl, sealed_memfd):
    fd = sealed_memfd(PATTERN)
    mm = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    os.close(fd)
    alive = weakref.ref(mm)
    storage = zerocopy.storage_from_buffer(memoryview(mm)[100:300])
    del mm
    gc.collect()
    assert alive() is not None, "the storage must hold the mapping"
    assert as_bytes(storage) == PATTERN[100:300]
    assert torch.empty(0, dtype=torch.uint8).set_(storage).sum().item() == sum(PATTERN[100:300])
    del storage
    gc.collect()
    assert alive() is None, "the mapping must be released with the last storage"


def test_mapping_cannot_be_closed_under_a_storage(impl, mapping):
    mm, _ = mapping
    storage = zerocopy.storage_from_buffer(memoryview(mm)[0:64])
    with pytest.raises(BufferError):
        mm.close()
    del storage
    gc.collect()
    mm.close()


def test_tensor_views_keep_the_mapping_alive(impl, sealed_memfd):
    fd = sealed_memfd(PATTERN)
    mm = mmap.mmap(fd, len(PATTERN), access=mmap.ACCESS_COPY)
    os.close(fd)
    alive = weakref.ref(mm)
    tensor = torch.empty(0, dtype=torch.int16).set_(zerocopy.storage_from_buffer(memoryview(mm)[0:512]))
    del mm
    gc.collect()
    assert alive() is not None
    assert tensor[:4].tolist() == torch.frombuffer(bytearray(PATTERN[:8]), dtype=torch.int16).tolist()
    del tensor
    gc.collect()
    assert alive() is None


# --- edge cases, identical on both paths ------------------------------------------------------------


def test_zero_byte_buffers_give_empty_storages_that_hold_nothing(impl, mapping):
    mm, _ = mapping
    for buf in (bytearray(), memoryview(mm)[10:10], b""):
        storage = zerocopy.storage_from_buffer(buf)
        assert isinstance(storage, torch.UntypedStorage)
        assert storage.nbytes() == 0
    del buf
    mm.close()  # no export left behind


def test_read_only_buffers_are_accepted_silently(impl):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        storage = zerocopy.storage_from_buffer(b"read only")
        ro = mmap.mmap(-1, 4096, access=mmap.ACCESS_READ)
        assert zerocopy.storage_from_buffer(ro).nbytes() == 4096
    assert as_bytes(storage) == b"read only"


def test_non_contiguous_buffer_is_refused(impl):
    with pytest.raises(BufferError):
        zerocopy.storage_from_buffer(memoryview(bytearray(16))[::2])


def test_non_buffer_is_refused(impl):
    with pytest.raises(TypeError):
        zerocopy.storage_from_buffer(12)


# --- every dtype ---------------------------------------------------------------------------------------

# Dtypes with arithmetic: compared by value after viewing them over the mapping.
VALUE_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
]
# Every other non-quantized dtype torch defines (bit containers, sub-byte and fp4 shells): torch has no
# kernels to compare them by value, so they are compared byte for byte. Quantized dtypes are left out:
# their scale and zero point live in the tensor, not the storage.
BYTE_DTYPES = sorted(
    {
        value
        for value in vars(torch).values()
        if isinstance(value, torch.dtype) and value not in VALUE_DTYPES and not str(value).startswith("torch.q")
    },
    key=str,
)


def sample(dtype: torch.dtype, n: int) -> torch.Tensor:
    """Finite, varied values of ``dtype`` (no NaN, so equality is meaningful)."""
    gen = torch.Generator().manual_seed(1234)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    if dtype.is_complex:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex32 is "experimental"
            return (torch.randn(n, dtype=torch.complex128, generator=gen) * 4).to(dtype)
    if dtype.is_floating_point:
        values = torch.randn(n, dtype=torch.float64, generator=gen) * 8
        if dtype == torch.float8_e8m0fnu:  # powers of two only, no sign
            values = values.abs() + 2**-10
        return values.to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(low, high, (n,), dtype=torch.int64, generator=gen).to(dtype)


def view_over_sealed_mapping(sealed_memfd, data: bytes, offset: int):
    fd = sealed_memfd(b"\xee" * offset + data)
    mm = mmap.mmap(fd, offset + len(data), access=mmap.ACCESS_COPY)
    os.close(fd)
    return zerocopy.storage_from_buffer(memoryview(mm)[offset : offset + len(data)])


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
def test_every_dtype_round_trips_by_value(impl, dtype, sealed_memfd):
    src = sample(dtype, 1000)
    storage = view_over_sealed_mapping(sealed_memfd, as_bytes(src.untyped_storage()), offset=192)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        view = torch.empty(0, dtype=dtype).set_(storage, 0, src.shape)
    assert as_bytes(view.untyped_storage()) == as_bytes(src.untyped_storage())
    if dtype == torch.complex32:  # no equal kernel: compare widened values
        assert torch.equal(view.to(torch.complex64), src.to(torch.complex64))
    else:
        assert torch.equal(view, src)
    if dtype.is_floating_point:
        assert not torch.isnan(src.to(torch.float64)).any()


@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_every_other_dtype_round_trips_byte_for_byte(impl, dtype, sealed_memfd):
    raw = bytes((i * 37 + 11) % 256 for i in range(512))
    storage = view_over_sealed_mapping(sealed_memfd, raw, offset=64)
    view = torch.empty(0, dtype=dtype).set_(storage, 0, (len(raw) // dtype.itemsize,))
    assert view.data_ptr() == storage.data_ptr()
    assert bytes(view.view(torch.uint8).tolist()) == raw


def test_the_dtype_lists_cover_the_named_families():
    names = {str(d) for d in VALUE_DTYPES + BYTE_DTYPES}
    for expected in ("torch.bfloat16", "torch.bool", "torch.complex64", "torch.float8_e5m2", "torch.bits8"):
        assert expected in names


# --- selecting the implementation ----------------------------------------------------------------------


@pytest.fixture
def restore_selection(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no extension built by overmind build-native takes part
    yield monkeypatch
    monkeypatch.undo()
    zerocopy._select()


def test_env_python_forces_the_twin(restore_selection):
    restore_selection.setenv(zerocopy.ENV, "python")
    assert zerocopy._select() == "python"
    assert zerocopy.IMPLEMENTATION == "python"
    info = zerocopy.describe()
    assert info["active"] == "python"
    assert "OVERMIND_ZEROCOPY=python" in info["reason"]


def test_env_c_without_the_extension_fails_loudly(restore_selection):
    restore_selection.setitem(sys.modules, "overmind.native._C", None)  # makes the import fail, as if never built
    restore_selection.setenv(zerocopy.ENV, "c")
    with pytest.raises(zerocopy.ExtensionUnavailable) as caught:
        zerocopy._select()
    message = str(caught.value)
    assert "OVERMIND_ZEROCOPY=c" in message and "overmind build-native" in message
    assert isinstance(caught.value, ImportError)


def test_unset_env_falls_back_to_the_twin_and_says_why(restore_selection):
    restore_selection.setitem(sys.modules, "overmind.native._C", None)
    restore_selection.delenv(zerocopy.ENV, raising=False)
    assert zerocopy._select() == "python"
    info = zerocopy.describe()
    assert info["active"] == "python" and info["extension_path"] is None
    assert "overmind.native._C does not import" in info["reason"] and "overmind build-native" in info["reason"]


def test_unset_env_prefers_the_extension(restore_selection, extension_problem):
    if extension_problem:
        pytest.skip(f"overmind.native._C does not import here ({extension_problem})")
    restore_selection.delenv(zerocopy.ENV, raising=False)
    assert zerocopy._select() == "c"
    info = zerocopy.describe()
    assert info["active"] == "c" and info["reason"].startswith("installed with overmind-core, built for torch ")
    assert os.path.basename(info["extension_path"]).startswith("_C.") and os.path.exists(info["extension_path"])


def test_unknown_env_value_reads_as_auto(restore_selection):
    # a bad setting is refused in overmind.settings (one warning at the user's next load), not raised.
    restore_selection.setenv(zerocopy.ENV, "fortran")
    assert zerocopy._select() == zerocopy._select("auto")

