"""The entry writer: pwrite from each storage's memory into a sealed memfd, the same bytes as the mapping way."""
from __future__ import annotations

import fcntl
import mmap
import os

import pytest
import torch

from overmind.shm import layout, reader, seals, writer


def _storages():
    torch.manual_seed(0)
    made = [torch.randn(1000), torch.arange(7, dtype=torch.int8), torch.empty(0), torch.randn(3, 5).half(),
            torch.randint(0, 255, (70_000,), dtype=torch.uint8)]
    out, off = [], 0
    for t in made:
        s = t.untyped_storage()
        off = layout.align(off, layout.STORAGE_ALIGN)
        out.append((s, off, t))
        off += s.nbytes()
    return out, off


def _contents(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        return bytes(mm)


@pytest.mark.parametrize("step", [writer._STEP, 4099])  # 4099: every storage crosses partial-write steps
def test_pwrite_and_mapping_write_the_same_sealed_entry(monkeypatch, step):
    assert writer.PWRITE
    monkeypatch.setattr(writer, "_STEP", step)
    items, data_len = _storages()
    skeleton = b"S" * 9000
    fd = writer.write_entry(skeleton, [(s, o) for s, o, _ in items], data_len)
    monkeypatch.setattr(writer, "PWRITE", False)
    fd_mapped = writer.write_entry(skeleton, [(s, o) for s, o, _ in items], data_len)
    try:
        assert _contents(fd) == _contents(fd_mapped)
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals.APPLIED == seals.APPLIED
        m = reader.EntryMapping("e", fd)
        assert bytes(m.skeleton()) == skeleton
        for s, off, t in items:
            got = torch.empty(0, dtype=t.dtype).set_(m.storage(off, s.nbytes()) if s.nbytes() else torch.UntypedStorage(0))
            assert torch.equal(got.view(-1), t.reshape(-1))
    finally:
        os.close(fd)
        os.close(fd_mapped)


def test_a_storage_that_cannot_be_read_fails_the_write_and_leaves_no_fd(monkeypatch):
    before = set(os.listdir("/proc/self/fd"))

    class Unreadable:
        device = torch.device("cpu")

        def nbytes(self):
            return 4096

        def data_ptr(self):
            return 8  # unmapped: the kernel answers EFAULT instead of crashing the process

    with pytest.raises(OSError):
        writer.write_entry(b"x", [(Unreadable(), 0)], 4096)
    assert set(os.listdir("/proc/self/fd")) <= before | {str(n) for n in range(3)}
