"""What writing converted tensors once would save: fp32 checkpoint bytes converted to fp16 and put into a memfd.

    python benchmarks/probes/convert_path.py [--mib 1024] [--reps 3]

``--mib`` of fp32 weights sit in a file in the page cache, mapped privately (as safetensors maps a checkpoint;
a fresh mapping for every run). Each way ends with the fp16 bytes in a new memfd, except ``plain``:

- ``plain``: ``t.to(torch.float16)`` into the heap, what a plain ``from_pretrained(torch_dtype=float16)`` pays;
- ``heap, then pwrite``: the same, then ``pwrite`` of each converted tensor into the memfd (Overmind today:
  the loader converts into the heap, publishing copies the result);
- ``into a mapping``: ``copy_`` converts each tensor straight into a shared mapping of the memfd (the bytes are
  written once; what an allocator that placed the loader's converted tensors in a memfd would do);
- ``fallocate, into a mapping``: the same after ``posix_fallocate`` of the memfd.

Prints seconds per GiB of fp16 output (min / median / max) and each way's cost over ``plain``, pair by pair.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time

import torch
from write_path import pwrite_all  # the same pwrite loop write_path.py times (this folder is on sys.path)

CHUNK = 64 << 20  # fp32 bytes per tensor


def make_file(total: int) -> str:
    f = tempfile.NamedTemporaryFile(prefix="om-convert-path-", dir="/tmp", delete=False)
    block = torch.randn(CHUNK // 4).numpy().tobytes()
    for _ in range(total // CHUNK):
        f.write(block)
    f.close()
    with open(f.name, "rb") as r:  # in the page cache
        while r.read(CHUNK):
            pass
    return f.name


def mapped_fp32(path: str, total: int):
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, total, access=mmap.ACCESS_COPY)
    os.close(fd)
    whole = torch.frombuffer(mm, dtype=torch.float32)
    n = CHUNK // 4
    return [whole[i:i + n] for i in range(0, whole.numel(), n)]


def run(way: str, sources) -> float:
    out_bytes = sum(t.numel() for t in sources) * 2
    t0 = time.perf_counter()
    if way == "plain":
        kept = [t.to(torch.float16) for t in sources]
        dt = time.perf_counter() - t0
        del kept
        return dt
    fd = os.memfd_create("om-convert-path", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, out_bytes)
        if way == "heap, then pwrite":
            off = 0
            kept = []
            for t in sources:
                h = t.to(torch.float16)
                pwrite_all(fd, h, off)
                off += h.numel() * 2
                kept.append(h)  # the user's process keeps its converted tensors until they are remapped
            dt = time.perf_counter() - t0
            del kept
            return dt
        if way.startswith("fallocate"):
            os.posix_fallocate(fd, 0, out_bytes)
        mm = mmap.mmap(fd, out_bytes, flags=mmap.MAP_SHARED)
        region = torch.frombuffer(mm, dtype=torch.float16)
        off = 0
        for t in sources:
            region[off:off + t.numel()].copy_(t)
            off += t.numel()
        dt = time.perf_counter() - t0
        del region
        mm.close()
        return dt
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="fp32 MiB to convert")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    total = args.mib << 20
    path = make_file(total)
    ways = ["plain", "heap, then pwrite", "into a mapping", "fallocate, into a mapping"]
    times: dict[str, list[float]] = {w: [] for w in ways}
    load = os.getloadavg()
    try:
        for rep in range(args.reps):
            for way in (ways if rep % 2 == 0 else ways[::-1]):
                times[way].append(run(way, mapped_fp32(path, total)))
    finally:
        os.unlink(path)
    gib_out = total / 2 / 2**30
    print(f"| {args.mib} MiB fp32 (page cache, private mapping) to fp16 | n | min s/GiB out | median | max "
          f"| over plain (pairs, median) |")
    print("|---|---:|---:|---:|---:|---:|")
    for way in ways:
        xs = [x / gib_out for x in times[way]]
        over = statistics.median(a / b for a, b in zip(times[way], times["plain"]))
        print(f"| {way} | {len(xs)} | {min(xs):.3f} | {statistics.median(xs):.3f} | {max(xs):.3f} | {over:.2f}x |")
    print(f"\nload average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; torch threads {torch.get_num_threads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
