"""The template maps its dense private anonymous memory as 2 MiB pages (runner/huge_pages.py): the bytes stay the same,
sparse memory does not grow, and a real template holds huge pages once it serves."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _support import run_support as rs
from overmind.runner import huge_pages


@pytest.fixture
def rt(overmind_runtime):
    yield overmind_runtime
    rs.stop_templates(overmind_runtime)


MAPS = """\
55d0c0000000-55d0c0a00000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000500000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 rw-p 00000000 00:00 0                          [anon:cpython obmalloc]
7f1000000000-7f1000400000 rw-p 00000000 fd:01 1234                       /usr/lib/libtorch_cpu.so
7f2000000000-7f2000400000 rw-p 00000000 00:01 77                         /memfd:overmind-entry (deleted)
7f3000000000-7f3000400000 rw-s 00000000 00:01 78                         /dev/shm/x
7f4000000000-7f4000400000 r--p 00000000 00:00 0
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0                          [stack]
7f5000100000-7f5000300000 rw-p 00000000 00:00 0
"""


def test_only_the_2mib_ranges_of_private_writable_anonymous_mappings_are_candidates():
    mib2 = huge_pages.HUGE
    assert huge_pages.candidate_ranges(MAPS) == [
        (0x55D0C0000000 + k * mib2, 0x55D0C0000000 + (k + 1) * mib2) for k in range(5)  # the heap: 10 MiB
    ] + [
        (0x7F0000000000, 0x7F0000200000), (0x7F0000200000, 0x7F0000400000),  # 5 MiB: the last 1 MiB is no range
        # the named anonymous mapping is 1 MiB: no whole aligned range; a file, a memfd, shared memory, a read-only
        # mapping and the stack are never candidates; 7f5000100000-7f5000300000 holds no aligned 2 MiB range
    ]


CHILD = r"""
import hashlib, json, mmap, sys
from overmind.runner import huge_pages

def smaps(addr):
    out, inside = {}, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head in ("Rss:", "AnonHugePages:"):
            out[head[:-1]] = int(line.split()[1])
    return out

size = 64 << 20
dense = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
sparse = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, size, 4096):
    dense[off] = (off >> 12) % 251 + 1
for off in range(0, size, 16 * 4096):
    sparse[off] = 7
import ctypes
addr = lambda m: ctypes.addressof(ctypes.c_char.from_buffer(m))
before = {"dense": hashlib.sha256(dense).hexdigest(), "sparse": hashlib.sha256(sparse).hexdigest(),
          "sparse_smaps": smaps(addr(sparse))}
done = huge_pages.collapse()
after = {"dense": hashlib.sha256(dense).hexdigest(), "sparse": hashlib.sha256(sparse).hexdigest(),
         "dense_smaps": smaps(addr(dense)), "sparse_smaps": smaps(addr(sparse))}
print(json.dumps({"done": done, "before": before, "after": after}))
"""


def test_collapse_maps_dense_memory_in_huge_pages_and_leaves_bytes_and_sparse_memory_as_they_were():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    if got["done"] == 0:
        pytest.skip("this kernel maps no huge pages on request (MADV_COLLAPSE needs Linux 6.1 and THP not 'never')")
    before, after = got["before"], got["after"]
    assert after["dense"] == before["dense"] and after["sparse"] == before["sparse"], "the bytes are the same"
    assert after["dense_smaps"]["AnonHugePages"] >= 60 * 1024, "the dense 64 MiB (but its unaligned ends) is huge"
    # The sparse mapping (1 page in 16 written, the rest read: the shared zero page) is left as it is, so it does not
    # grow. (Its mapping may have merged with the dense one: what the kernel reports for it covers both.)
    assert after["sparse_smaps"]["Rss"] <= before["sparse_smaps"]["Rss"] + 2048, (before, after)
    assert after["sparse_smaps"]["AnonHugePages"] <= 64 * 1024, (before, after)


def test_a_serving_template_holds_its_memory_in_huge_pages(rt, tmp_path):
    probe = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or json.loads(probe.stdout)["done"] == 0:
        pytest.skip("this kernel maps no huge pages on request")
    script = rs.write(str(tmp_path), "prog.py", "print('ran')\n")
    first = rs.run([script], rt)
    assert first.returncode == 0 and first.stdout.strip() == "ran", first.stderr
    (template,) = rs.templates(rt)
    with open(f"/proc/{template['pid']}/smaps_rollup") as f:
        fields = {line.split()[0]: int(line.split()[1]) for line in f if line.split()[-1] == "kB"}
    assert fields["AnonHugePages:"] >= 32 * 1024, fields
    again = rs.run([script], rt)  # a child forked from huge pages runs as any other
    assert again.returncode == 0 and again.stdout.strip() == "ran", again.stderr
