"""The registry of live mappings and the pristine check (pagemap): written pages are seen, gaps are not."""
from __future__ import annotations

import torch

from overmind.shm import mappings, pagemap
from overmind.shm.reader import EntryMapping
from overmind.shm.writer import write_entry

PAGE = pagemap.PAGE


def _mapped_entry(n_pages: int) -> EntryMapping:
    data = torch.arange(n_pages * PAGE, dtype=torch.uint8)
    fd = write_entry(b"skeleton", [(data.untyped_storage(), 0)], data.numel())
    try:
        return EntryMapping("e-1", fd)
    finally:
        import os

        os.close(fd)


def test_written_pages_are_seen_and_untouched_ones_are_not():
    m = _mapped_entry(40)
    a = m.storage(0, 4 * PAGE)
    b = m.storage(20 * PAGE, 4 * PAGE)
    ta, tb = (torch.empty(0, dtype=torch.uint8).set_(s) for s in (a, b))
    assert ta[5] == 5 and tb[0] == 0  # read: pages faulted in from the memfd, still pristine
    ranges = [(a.data_ptr(), a.nbytes()), (b.data_ptr(), b.nbytes())]
    assert pagemap.all_pristine(ranges)
    gap = m.storage(10 * PAGE, PAGE)
    torch.empty(0, dtype=torch.uint8).set_(gap).fill_(1)  # written, but between the two ranges
    assert pagemap.all_pristine(ranges), "a written page in a gap between ranges must not count"
    tb[PAGE + 1] = 7
    assert not pagemap.all_pristine(ranges)
    assert pagemap.all_pristine(ranges[:1])
    assert mappings.locate(b.data_ptr(), b.nbytes()) is None  # no longer the entry's bytes
    loc = mappings.locate(a.data_ptr(), a.nbytes())
    assert loc == ("e-1", 0)


def test_a_mapping_leaves_the_registry_when_its_last_storage_dies():
    import gc

    m = _mapped_entry(2)
    s = m.storage(0, PAGE)
    ptr = s.data_ptr()
    del m
    gc.collect()
    assert mappings.contains(ptr)  # the storage keeps the mapping alive
    assert mappings.contain_all([ptr, ptr + 1]) and mappings.contain_all([])
    outside = torch.zeros(4).data_ptr()
    assert not mappings.contain_all([ptr, outside]) and not mappings.contains(outside)
    del s
    gc.collect()
    assert not mappings.contains(ptr) and not mappings.contain_all([ptr])


class _Holder:
    """Stands for an mmap: the registry keeps a weak reference to it."""


def test_contain_all_answers_as_contains_for_each_address(monkeypatch):
    """Every list of up to three addresses taken from each side of each end of registered spans (two of them
    adjacent), between them and outside: contain_all (which answers at once when one span holds the lowest and the
    highest) says what contains says of each."""
    import itertools

    monkeypatch.setattr(mappings, "_starts", [])
    monkeypatch.setattr(mappings, "_spans", {})
    base = 1 << 40
    holders = []
    for i, (start, end) in enumerate([(0, 100), (100, 150), (300, 400), (1000, 1001)]):
        holders.append(_Holder())
        mappings.register(f"e-{i}", base + start, base + end, holders[-1])  # type: ignore[arg-type]
    edges = [-1, 0, 1, 99, 100, 101, 149, 150, 151, 200, 299, 300, 399, 400, 999, 1000, 1001]
    for n in range(4):
        for offsets in itertools.product(edges, repeat=n):
            ptrs = [base + o for o in offsets]
            assert mappings.contain_all(ptrs) == all(mappings.contains(p) for p in ptrs), offsets
