"""How fast can tensor bytes go into a fresh memfd? The ways an entry could be written, timed on this machine.

    python benchmarks/probes/write_path.py [--mib 1024] [--reps 3] [--source anon|file|lazy-file]

Each way writes the same bytes (one tensor per 64 MiB, like a checkpoint's big weights) into a new memfd:

- ``map+copy``: ftruncate, a MAP_SHARED|MAP_POPULATE mapping, ``tensor.copy_`` into it;
- ``fallocate+map+copy``: the same after ``posix_fallocate`` of the whole file;
- ``pwrite``: ftruncate, then ``os.pwrite`` from each tensor's own memory (no mapping of the memfd at all);
- ``fallocate+pwrite``: ``posix_fallocate`` first, then ``pwrite``;
- ``sendfile`` (file sources only): the kernel copies from the checkpoint file's page cache into the memfd,
  without touching the process's mapping of the file.

``--source file`` takes the bytes from a private mapping of a file in the page cache whose pages were read
once (mapped), ``lazy-file`` from a fresh private mapping of it, never read (an fp16 safetensors checkpoint
loaded lazily: every pwrite then faults the source pages in), ``anon`` from ordinary tensors already in memory
(a converted checkpoint).
Prints one markdown table: GiB/s per way (min / median / max over the repetitions), with the load average.
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import sys
import tempfile
import time

import torch

CHUNK = 64 << 20
PWRITE_MAX = 1 << 30  # Linux writes at most 0x7ffff000 bytes per call


def sources(total: int, kind: str):
    if kind == "anon":
        return [torch.randint(0, 255, (CHUNK,), dtype=torch.uint8) for _ in range(total // CHUNK)], None
    f = tempfile.NamedTemporaryFile(prefix="om-write-path-", dir="/tmp", delete=False)
    for _ in range(total // CHUNK):
        f.write(os.urandom(1 << 20) * 64)
    f.close()
    return None, f.name


def file_tensors(path: str, total: int, touched: bool):
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, total, access=mmap.ACCESS_COPY)
    whole = torch.frombuffer(mm, dtype=torch.uint8)
    if touched:
        whole.max()  # mapped page by page, as a lazily loaded checkpoint is once read
    else:
        os.pread(fd, 1, 0)
        with open(path, "rb") as f:  # in the page cache, but not mapped here
            while f.read(CHUNK):
                pass
    return [whole[i:i + CHUNK] for i in range(0, total, CHUNK)], fd


def pwrite_all(fd: int, t: torch.Tensor, offset: int) -> None:
    n, ptr, done = t.numel() * t.element_size(), t.data_ptr(), 0
    while done < n:
        step = min(n - done, PWRITE_MAX)
        view = memoryview((ctypes.c_char * step).from_address(ptr + done)).cast("B")
        done += os.pwrite(fd, view, offset + done)


def write(way: str, tensors, src_fd: int | None = None) -> float:
    total = sum(t.numel() for t in tensors)
    t0 = time.perf_counter()
    fd = os.memfd_create("om-write-path", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, total)
        if way.startswith("fallocate"):
            os.posix_fallocate(fd, 0, total)
        if way.endswith("copy"):
            mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            region = torch.frombuffer(mm, dtype=torch.uint8)
            off = 0
            for t in tensors:
                region[off:off + t.numel()].copy_(t)
                off += t.numel()
            del region
            mm.close()
        elif way == "sendfile":
            done = 0
            while done < total:
                done += os.sendfile(fd, src_fd, done, total - done)
        else:
            off = 0
            for t in tensors:
                pwrite_all(fd, t, off)
                off += t.numel()
        return total / (time.perf_counter() - t0) / 2**30
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--source", choices=("anon", "file", "lazy-file"), default="anon")
    args = ap.parse_args()
    total = args.mib << 20
    tensors, path = sources(total, args.source)
    ways = ["map+copy", "fallocate+map+copy", "pwrite", "fallocate+pwrite"] + (["sendfile"] if path else [])
    speeds: dict[str, list[float]] = {w: [] for w in ways}
    load = os.getloadavg()
    try:
        for rep in range(args.reps):
            for way in (ways if rep % 2 == 0 else ways[::-1]):
                src_fd = None
                if path:  # a fresh mapping for every write: a lazy source is faulted in by each
                    tensors, src_fd = file_tensors(path, total, touched=args.source == "file")
                speeds[way].append(write(way, tensors, src_fd))
                if src_fd is not None:
                    tensors = None
                    os.close(src_fd)
    finally:
        if path:
            os.unlink(path)
    print(f"| {args.mib} MiB from {args.source} memory into a new memfd | n | min GiB/s | median | max |")
    print("|---|---:|---:|---:|---:|")
    for way in ways:
        xs = speeds[way]
        print(f"| {way} | {len(xs)} | {min(xs):.2f} | {statistics.median(xs):.2f} | {max(xs):.2f} |")
    print(f"\nload average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; torch threads {torch.get_num_threads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
