"""The pagemap reading behind provenance and references: a written page anywhere in a range is seen, a written
page in a gap between ranges is not, and the byte-level reading agrees with the bit definitions entry by entry."""
from __future__ import annotations

import random
import struct

from overmind.shm import mappings

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
        assert mappings._written_pages(raw, base, pieces) == _reference(entries, base, pieces), (trial, pieces)


def test_one_written_page_among_many_untouched_is_seen_and_one_in_a_gap_is_not():
    n = 5000
    entries = [PRESENT | FILE_OR_SHARED] * n
    entries[4321] = PRESENT | 0x1234  # private anonymous: written
    raw = struct.pack(f"<{n}Q", *entries)
    assert mappings._written_pages(raw, 100, [(100, 100 + n - 1)])
    assert not mappings._written_pages(raw, 100, [(100, 100 + 4320), (100 + 4322, 100 + n - 1)])


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
    assert mm[0] == 1 and mappings.all_pristine([(ptr, 4 * mmap.PAGESIZE)])  # the parent's fd is open now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write one page, then ask
        try:
            mm[mmap.PAGESIZE] = 2
            seen = mappings.all_pristine([(ptr, 4 * mmap.PAGESIZE)])
            os.write(w, b"clean" if seen else b"written")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 16)
    os.waitpid(pid, 0)
    assert answer == b"written", "the child read its parent's pagemap"
    assert mappings.all_pristine([(ptr, 4 * mmap.PAGESIZE)])  # the parent's pages are untouched
    del buf
    mm.close()
