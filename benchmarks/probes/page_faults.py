"""How fast this machine gives a process fresh memory, against how fast it copies memory it already has.

    python benchmarks/probes/page_faults.py [--gib 1] [-n 3]

A cold Overmind load writes every weight once into a fresh memfd; the plain fp32-to-fp16 load converts into
fresh anonymous memory. Both pay the kernel (and, in a VM, the hypervisor) for every new page. This prints,
in GiB/s, each way of getting ``--gib`` GiB of fresh pages, next to a copy between two buffers whose pages
are already there; each sample in a fresh process, so no page is reused from an earlier sample.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "harness")))

CHILD = r'''
import json, mmap, os, sys, time
import torch
torch.set_num_threads(1)
n = int(float(sys.argv[1]) * 2**30)
out = {}
t = time.perf_counter(); a = torch.empty(n, dtype=torch.uint8); a.fill_(1); out["anonymous: fault + fill"] = time.perf_counter() - t
fd = os.memfd_create("page-faults")
os.ftruncate(fd, n)
t = time.perf_counter(); mm = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE); out["memfd: MAP_POPULATE"] = time.perf_counter() - t
region = torch.frombuffer(mm, dtype=torch.uint8)
t = time.perf_counter(); region.copy_(a); out["copy into the populated memfd"] = time.perf_counter() - t
b = torch.empty(n, dtype=torch.uint8); b.fill_(0)
t = time.perf_counter(); b.copy_(a); out["copy between faulted buffers"] = time.perf_counter() - t
print("PF:" + json.dumps(out))
'''


def main(argv=None) -> int:
    import harness
    import report

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("-n", type=int, default=3)
    args = ap.parse_args(argv)
    rates: dict[str, list[float]] = {}
    for _ in range(args.n):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.gib)], capture_output=True, text=True, check=True)
        sample = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("PF:"))[3:])
        for k, secs in sample.items():
            rates.setdefault(k, []).append(args.gib / secs)
    rows = [f"| {args.gib:g} GiB, one thread (GiB/s) | n | min | median | max |", "|---|---:|---:|---:|---:|"]
    for k, xs in rates.items():
        n, lo, med, hi = report.summary(xs)
        rows.append(f"| {k} | {n} | {lo:.2f} | {med:.2f} | {hi:.2f} |")
    print(f"`python benchmarks/probes/page_faults.py --gib {args.gib:g} -n {args.n}`\n\n" + "\n".join(rows) + "\n\n"
          + report.machine_line(harness.machine()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
