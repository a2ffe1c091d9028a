"""The pagemap reading behind provenance and references: a written page anywhere in a range is seen, a written
page in a gap between ranges is not, the byte-level reading agrees with the bit definitions entry by entry, and an
encode's snapshot (``PageSnapshot``) answers as a fresh read would, across its chunks' edges."""
from __future__ import annotations

import random
import struct

from overmind.shm import pagemap

PRESENT, SWAPPED, FILE_OR_SHARED = 1 << 63, 1 << 62, 1 << 61


def _reference(entries: list[int], base: int, pieces) -> bool:
    def written(e):
        return bool(e & (PRESENT | SWAPPED)) and not e & FILE_OR_SHARED
    return any(written(entries[p - base]) for first, last in pieces for p in range(first, last + 1))


def test_written_pages_match_the_bit_definitions_on_random_pagemaps():
    rng = random.Random(12)
    kinds = [0, PRESENT | FILE_OR_SHARED, PRESENT, SWAPPED, SWAPPED | FILE_OR_SHARED, FILE_OR_SHARED]
    for trial in range(400):
        n = rng.randint(1, 300)
        # mostly untouched pages, now and then one written: both answers occur
        entries = [rng.choice(kinds[:2]) | rng.getrandbits(55) if rng.random() < 0.97 else rng.choice(kinds)
                   | rng.getrandbits(55) for _ in range(n)]
        raw = struct.pack(f"<{n}Q", *entries)
        base = rng.randint(0, 10**6)
        cuts = sorted(rng.sample(range(n), min(n, rng.randint(1, 6))))
        pieces = [(base + a, base + min(n - 1, a + rng.randint(0, 20))) for a in cuts]
        assert pagemap._written_pages(raw, base, pieces) == _reference(entries, base, pieces), (trial, pieces)


def test_one_written_page_among_many_untouched_is_seen_and_one_in_a_gap_is_not():
    n = 5000
    entries = [PRESENT | FILE_OR_SHARED] * n
    entries[4321] = PRESENT | 0x1234  # private anonymous: written
    raw = struct.pack(f"<{n}Q", *entries)
    assert pagemap._written_pages(raw, 100, [(100, 100 + n - 1)])
    assert not pagemap._written_pages(raw, 100, [(100, 100 + 4320), (100 + 4322, 100 + n - 1)])


def test_a_forked_child_reads_its_own_pages_not_its_parents(tmp_path):
    # The pagemap fd is opened once per process: a child must never read its parent's (whose page is still the
    # file's while the child's copy-on-write page holds other bytes).
    import mmap
    import os

    path = tmp_path / "weights.bin"
    path.write_bytes(b"\1" * (4 * mmap.PAGESIZE))
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    buf = (mmap.PAGESIZE * 4 * __import__("ctypes").c_char).from_buffer(mm)
    ptr = __import__("ctypes").addressof(buf)
    assert mm[0] == 1 and pagemap.all_pristine([(ptr, 4 * mmap.PAGESIZE)])  # the parent's fd is open now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write one page, then ask
        try:
            mm[mmap.PAGESIZE] = 2
            seen = pagemap.all_pristine([(ptr, 4 * mmap.PAGESIZE)])
            os.write(w, b"clean" if seen else b"written")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 16)
    os.waitpid(pid, 0)
    assert answer == b"written", "the child read its parent's pagemap"
    assert pagemap.all_pristine([(ptr, 4 * mmap.PAGESIZE)])  # the parent's pages are untouched
    del buf
    mm.close()


class _SmallChunks(pagemap.PageSnapshot):
    CHUNK_PAGES = 4  # ranges cross chunk edges at every few pages


def _private_file_mapping(tmp_path, n_pages: int):
    import ctypes
    import mmap

    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (n_pages * mmap.PAGESIZE // 256))
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    buf = (ctypes.c_char * (n_pages * mmap.PAGESIZE)).from_buffer(mm)
    return mm, buf, ctypes.addressof(buf)


_N_PAGES = 37


def test_a_snapshot_answers_as_a_fresh_read_does(tmp_path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    mm, buf, ptr = _private_file_mapping(tmp_path, _N_PAGES)
    page = pagemap.PAGE
    ranges = st.tuples(st.integers(0, _N_PAGES * page - 1), st.integers(0, 3 * page))

    @settings(max_examples=60, deadline=None)
    @given(read=st.sets(st.integers(0, _N_PAGES - 1)), written=st.sets(st.integers(0, _N_PAGES - 1)),
           asked=st.lists(ranges, min_size=1, max_size=12), chunked=st.sampled_from([_SmallChunks, pagemap.PageSnapshot]))
    def check(read, written, asked, chunked):
        # A fresh private mapping per example: a page once written stays written.
        nonlocal mm, buf, ptr
        del buf
        mm.close()
        mm, buf, ptr = _private_file_mapping(tmp_path, _N_PAGES)
        for p in read:
            assert mm[p * page] == 0  # faulted in from the file: still the file's page
        for p in written:
            mm[p * page + 1] = 0xAB
        snap = chunked()
        for offset, nbytes in asked:
            nbytes = min(nbytes, _N_PAGES * page - offset)
            expected = pagemap.is_pristine(ptr + offset, nbytes)
            first, last = offset // page, (offset + max(nbytes, 1) - 1) // page
            assert expected == (nbytes == 0 or not any(first <= p <= last for p in written))
            assert snap.pristine(ptr + offset, nbytes) == expected, (offset, nbytes, sorted(written))

    check()
    del buf
    mm.close()


def test_a_snapshot_keeps_its_first_read_and_a_new_one_sees_later_writes(tmp_path):
    # The documented lifetime: one encode. A write after the snapshot read its chunk is not seen by it.
    mm, buf, ptr = _private_file_mapping(tmp_path, 8)
    snap = pagemap.PageSnapshot()
    assert snap.pristine(ptr, 8 * pagemap.PAGE)
    mm[3 * pagemap.PAGE] = 1
    assert snap.pristine(ptr + 3 * pagemap.PAGE, 1)
    assert not pagemap.PageSnapshot().pristine(ptr + 3 * pagemap.PAGE, 1)
    assert not pagemap.is_pristine(ptr, 8 * pagemap.PAGE)
    del buf
    mm.close()


def test_a_snapshot_that_cannot_read_pagemap_calls_every_page_written(tmp_path, monkeypatch):
    mm, buf, ptr = _private_file_mapping(tmp_path, 2)

    def unreadable():
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pagemap, "_pagemap_fd", unreadable)
    assert not pagemap.PageSnapshot().pristine(ptr, pagemap.PAGE)
    assert not pagemap.is_pristine(ptr, pagemap.PAGE)
    del buf
    mm.close()


def _kernel_scans() -> bool:
    import os

    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    return release >= (6, 7)


def test_several_ranges_answer_the_same_scanned_or_read(tmp_path, monkeypatch):
    """all_pristine over clusters of ranges: the kernel's scan (with the entries read only where it finds a written
    page, perhaps in a gap) and the plain reading give the same answer, and both the truth."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    mm, buf, ptr = _private_file_mapping(tmp_path, _N_PAGES)
    page = pagemap.PAGE
    ranges = st.tuples(st.integers(0, _N_PAGES * page - 1), st.integers(0, 3 * page))

    @settings(max_examples=80, deadline=None)
    @given(read=st.sets(st.integers(0, _N_PAGES - 1)), written=st.sets(st.integers(0, _N_PAGES - 1), max_size=3),
           asked=st.lists(ranges, min_size=1, max_size=8))
    def check(read, written, asked):
        nonlocal mm, buf, ptr
        del buf
        mm.close()
        mm, buf, ptr = _private_file_mapping(tmp_path, _N_PAGES)
        for p in read:
            assert mm[p * page] == 0
        for p in written:
            mm[p * page + 1] = 0xAB
        asked = [(ptr + offset, min(nbytes, _N_PAGES * page - offset)) for offset, nbytes in asked]
        truth = not any(nbytes and offset // page <= p + ptr // page <= (offset + nbytes - 1) // page
                        for offset, nbytes in asked for p in written)
        scanned = pagemap.all_pristine(asked)
        with monkeypatch.context() as m:
            m.setattr(pagemap, "_scan_works", False)
            read_only = pagemap.all_pristine(asked)
        assert scanned == read_only == truth, (asked, sorted(written))

    check()
    del buf
    mm.close()


def test_the_scan_answers_on_this_kernel_and_sees_one_written_page(tmp_path):
    import pytest

    if not _kernel_scans():
        pytest.skip("PAGEMAP_SCAN needs Linux 6.7 or later; the entries are read instead (tested above)")
    mm, buf, ptr = _private_file_mapping(tmp_path, 8)
    first = ptr // pagemap.PAGE
    fd = pagemap._pagemap_fd()
    assert mm[0] == 0 and pagemap._scan_finds_no_written_page(fd, first, first + 7)  # read pages are the file's
    mm[5 * pagemap.PAGE] = 1
    assert not pagemap._scan_finds_no_written_page(fd, first, first + 7)
    assert pagemap._scan_finds_no_written_page(fd, first, first + 4)
    assert pagemap._scan_works
    del buf
    mm.close()


def test_ranges_on_both_sides_of_a_hole_and_of_a_written_page_answer_the_truth(tmp_path):
    """One scan of the whole extent answers for every range when nothing in it was written, holes included; a
    written page between the ranges sends the question span by span, which answers for the ranges alone."""
    import ctypes

    page = pagemap.PAGE
    mm, buf, ptr = _private_file_mapping(tmp_path, 12)
    assert mm[0] == 0 and mm[11 * page] == 11 * page % 256
    ranges = [(ptr, 2 * page), (ptr + 10 * page, 2 * page)]
    assert pagemap.all_pristine(ranges)
    if _kernel_scans():
        assert pagemap._extent_unwritten(ranges)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    assert libc.munmap(ptr + 4 * page, 2 * page) == 0  # a hole between the ranges
    assert pagemap.all_pristine(ranges)
    if _kernel_scans():
        assert pagemap._extent_unwritten(ranges)
    mm[7 * page] = 1  # a written page between them, in none of them
    assert pagemap.all_pristine(ranges)
    if _kernel_scans():
        assert not pagemap._extent_unwritten(ranges)
    mm[11 * page] = 1  # and one in a range
    assert not pagemap.all_pristine(ranges)
    del buf
    mm.close()  # munmap of the whole mapping, hole included
