"""What a fresh page costs a process that starts right after another process took gigabytes and kept them.

    python benchmarks/probes/fresh_pages_after_a_hold.py [--gib 2] [--probe-mib 256] [-n 5]

No Overmind and no torch here: plain processes, to tell this machine's behaviour from the product's. Each
repetition runs, for each situation, two probe processes one after the other; a probe maps ``--probe-mib`` MiB
of fresh anonymous memory and writes it once (every page faulted in, as a new process's heap is), then again
(pages already there). Situations, before the probes:

- ``quiet``: nothing;
- ``taken and freed``: a process writes ``--gib`` GiB of anonymous memory and exits (a plain fp32 load's
  conversion buffers);
- ``taken and kept``: a holder process writes ``--gib`` GiB into a memfd and keeps it until the probes are done
  (Overmind's server holding a converted fp32 entry after the cold process published it).

On a VM (docs/benchmarks.md, "The cost of fresh pages") a probe now and then gets its fresh pages 4-5x slower than
the others, all of it system time, with no other work on the machine: seen after ``taken and kept`` (and after a
cold fp32 Overmind process, whose server keeps 2 GiB), not after ``taken and freed`` or ``quiet``; how often
depends on what the machine did before (2 of 2 first probes in one try, 1 of 6 probes in another, 0 of 3 in a
third). The table counts the slow probes (under half the quiet probes' median rate).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PROBE = r'''
import ctypes, mmap, resource, sys, time
n = int(sys.argv[1]) << 20
m = mmap.mmap(-1, n)
buf = (ctypes.c_char * n).from_buffer(m)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter(); ctypes.memset(ctypes.addressof(buf), 1, n); fresh = time.perf_counter() - t
r1 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter(); ctypes.memset(ctypes.addressof(buf), 2, n); again = time.perf_counter() - t
print(f"{fresh} {r1.ru_stime - r0.ru_stime} {again}")
del buf
'''

TAKE_AND_FREE = r'''
import mmap, sys
n = int(float(sys.argv[1]) * 2**30)
m = mmap.mmap(-1, n)
for off in range(0, n, 1 << 20):
    m[off:off + (1 << 20)] = b"\1" * (1 << 20)
'''

TAKE_AND_KEEP = r'''
import os, sys
n = int(float(sys.argv[1]) * 2**30)
fd = os.memfd_create("fresh-pages-hold")
chunk = b"\1" * (64 << 20)
for off in range(0, n, len(chunk)):
    os.pwrite(fd, chunk[:min(len(chunk), n - off)], off)
print("ready", flush=True)
sys.stdin.read()
'''


def probe(mib: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(mib)], capture_output=True, text=True, check=True).stdout
    fresh, sys_s, again = (float(x) for x in out.split())
    return {"fresh_gib_s": mib / 1024 / fresh, "sys_s": sys_s, "again_gib_s": mib / 1024 / again}


def situation(name: str, gib: float, mib: int) -> list[dict]:
    """The two probes after ``name`` is set up (and the holder, if any, released after them)."""
    holder = None
    if name == "taken and freed":
        subprocess.run([sys.executable, "-c", TAKE_AND_FREE, str(gib)], check=True)
    elif name == "taken and kept":
        holder = subprocess.Popen([sys.executable, "-c", TAKE_AND_KEEP, str(gib)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    try:
        return [probe(mib), probe(mib)]
    finally:
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="memory the process before the probes takes (GiB)")
    ap.add_argument("--probe-mib", type=int, default=256, help="fresh memory each probe writes (MiB)")
    ap.add_argument("-n", type=int, default=5, help="repetitions")
    args = ap.parse_args(argv)
    names = ["quiet", "taken and freed", "taken and kept"]
    samples: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.n):
        for name in names:
            time.sleep(3)  # the previous situation's memory settles
            for k, sample in enumerate(situation(name, args.gib, args.probe_mib)):
                samples.setdefault((name, k), []).append(sample)
    print(f"Fresh pages after another process took {args.gib:g} GiB; each probe writes {args.probe_mib} MiB "
          f"(n={args.n}; min / median / max)\n")
    print("| before the probe | probe | fresh pages, GiB/s | system time of the first write, s | "
          "the same pages again, GiB/s | slow probes |")
    print("|---|---|---:|---:|---:|---:|")
    quiet = statistics.median(x["fresh_gib_s"] for k in (0, 1) for x in samples[("quiet", k)])

    def cell(xs: list[float], fmt: str) -> str:
        return " / ".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))

    for name in names:
        for k in (0, 1):
            s = samples[(name, k)]
            print(f"| {name} | {'first' if k == 0 else 'second'} | {cell([x['fresh_gib_s'] for x in s], '.2f')} | "
                  f"{cell([x['sys_s'] for x in s], '.3f')} | {cell([x['again_gib_s'] for x in s], '.1f')} | "
                  f"{sum(x['fresh_gib_s'] < quiet / 2 for x in s)} of {len(s)} |")
    load = os.getloadavg()[0]
    print(f"\nLoad average at the end: {load:.1f}; {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
