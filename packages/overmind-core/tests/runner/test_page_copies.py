"""The pages a program copied from the template, recorded and copied ahead by the next spare (``runner/page_copies.py``).

Real forks of a process holding an anonymous private mapping: a child that writes some pages records exactly those
(and no page it only read); a second child copies the recorded pages ahead, which makes them its own without changing
a byte, while every other page stays shared. File mappings are never recorded. The ``overmind run`` side (the first
program of a generation records, the next spare copies ahead) is in ``test_run_prebuilt.py``.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os

import pytest

from overmind.runner import page_copies

PAGE = page_copies.PAGE
N = 32


def _own_copy(addr: int, n: int) -> list[bool]:
    """Per page: present, mapped by this process alone, and not a file's page (bits 63, 56 and 61 of pagemap)."""
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        raw = os.pread(fd, n * 8, addr // PAGE * 8)
    finally:
        os.close(fd)
    return [raw[i * 8 + 7] & 0xA1 == 0x81 for i in range(n)]


def _in_child(fn) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            out = json.dumps(fn()).encode()
        except BaseException as exc:  # the test reads the failure
            out = json.dumps({"error": repr(exc)}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    got = json.loads(data)
    assert "error" not in got, got["error"]
    return got


def _address(mm: mmap.mmap, nbytes: int) -> int:
    return ctypes.addressof((ctypes.c_char * nbytes).from_buffer(mm))


@pytest.fixture
def region():
    mm = mmap.mmap(-1, N * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(N):
        mm[i * PAGE] = i + 1  # every page present in the parent
    return mm, _address(mm, N * PAGE)


def test_a_child_records_the_pages_it_wrote_and_not_those_it_read(region, tmp_path):
    mm, addr = region
    path = str(tmp_path / "t.0.pages")
    first = addr // PAGE

    def child():
        _ = [mm[i * PAGE] for i in range(N)]  # every page read
        for i in range(3, 10):
            mm[i * PAGE + 1] = 0xAB  # pages 3..9 written
        page_copies.record(path)
        return {"runs": page_copies.read(path)}

    runs = _in_child(child)["runs"]
    pages = {p for start, count in runs for p in range(start, start + count)}
    assert {first + i for i in range(3, 10)} <= pages
    assert not pages & {first + i for i in (0, 1, 2, 10, 20, 31)}, "a page only read is the template's still"


def test_a_second_child_copies_the_recorded_pages_ahead_without_changing_a_byte(region, tmp_path):
    mm, addr = region
    path = str(tmp_path / "t.0.pages")

    def writer():
        for i in (4, 5, 6, 17):
            mm[i * PAGE + 1] = 0xCD
        return {"pages": page_copies.record(path)}

    assert _in_child(writer)["pages"] >= 4

    def spare():
        before = _own_copy(addr, N)
        copied = page_copies.copy_ahead(path)
        after = _own_copy(addr, N)
        return {"before": before, "after": after, "copied": copied, "bytes": [mm[i * PAGE] for i in range(N)],
                "second": [mm[i * PAGE + 1] for i in range(N)]}

    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if release < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14: nothing is copied ahead here")
    got = _in_child(spare)
    assert got["copied"] >= 4
    assert not any(got["before"][i] for i in (4, 5, 6, 17)), "shared with the parent before"
    assert all(got["after"][i] for i in (4, 5, 6, 17)), "the spare's own after"
    assert not any(got["after"][i] for i in (0, 3, 7, 16, 18, 31)), "the other pages stay shared"
    assert got["bytes"] == [i + 1 for i in range(N)] and set(got["second"]) == {0}, "no byte changed"


def test_file_mappings_are_never_recorded(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * (4 * PAGE))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    start = _address(mm, 4 * PAGE) // PAGE
    mm[0] = 1  # a private copy of a file page: an entry's storage written, which must stay visible as written
    runs = page_copies.copied_pages(limit=1 << 30)
    assert not any(s <= start < s + n for s, n in runs)


def test_a_bad_or_missing_record_copies_nothing(tmp_path):
    assert page_copies.copy_ahead(str(tmp_path / "none.pages")) == 0
    bad = tmp_path / "bad.pages"
    bad.write_bytes(b"not a record")
    assert page_copies.read(str(bad)) == [] and page_copies.copy_ahead(str(bad)) == 0


def test_forget_removes_every_generation_of_one_template_only(tmp_path):
    for name in ("a1-x.0.pages", "a1-x.3.pages", "a1-x.2.pages.77.tmp", "a1-x.json", "b2-y.0.pages"):
        (tmp_path / name).write_bytes(b"")
    page_copies.forget(str(tmp_path), "a1-x")
    assert sorted(os.listdir(tmp_path)) == ["a1-x.json", "b2-y.0.pages"]


def test_at_most_the_limit_is_recorded(region):
    mm, addr = region

    def child():
        for i in range(N):
            mm[i * PAGE + 2] = 7
        return {"runs": page_copies.copied_pages(limit=5)}

    runs = _in_child(child)["runs"]
    assert sum(n for _, n in runs) == 5


def test_a_recorded_page_that_is_a_file_page_here_is_not_copied(tmp_path):
    """A page recorded as anonymous that holds a file mapping in this process (an entry mapped where the recording
    program had heap) stays the file's: a copy would read as written to the pristine checks."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\1" * (4 * PAGE))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    start = _address(mm, 4 * PAGE) // PAGE
    assert mm[0] == 1 and mm[3 * PAGE] == 1  # read: the file's pages, present
    record = str(tmp_path / "t.0.pages")
    with open(record, "wb") as f:
        f.write(page_copies._MAGIC + __import__("struct").pack("<QQ", start, 4))
    assert page_copies.copy_ahead(record) == 0
    assert not any(_own_copy(start * PAGE, 4))


def test_within_keeps_exactly_the_parts_of_runs_inside_spans():
    import itertools

    spans = [(10, 5), (20, 3), (30, 1)]
    inside = {p for s, n in spans for p in range(s, s + n)}
    for first, count in itertools.product(range(5, 35), range(1, 12)):
        got = page_copies._within([(first, count)], spans)
        assert {p for s, n in got for p in range(s, s + n)} == set(range(first, first + count)) & inside
        assert all(n > 0 for _, n in got)


def test_copying_stops_when_asked_between_chunks(region, tmp_path, monkeypatch):
    mm, addr = region
    path = str(tmp_path / "t.0.pages")

    def writer():
        for i in range(N):
            mm[i * PAGE + 1] = 9
        return {"pages": page_copies.record(path)}

    assert _in_child(writer)["pages"] >= N
    monkeypatch.setattr(page_copies, "CHUNK_PAGES", 4)

    def spare():
        asked = []
        copied = page_copies.copy_ahead(path, stop=lambda: asked.append(1) or len(asked) > 2)
        return {"copied": copied, "own": sum(_own_copy(addr, N))}

    got = _in_child(spare)
    assert got["copied"] <= 8 and got["own"] <= 8, "two chunks of four, then the request came first"
