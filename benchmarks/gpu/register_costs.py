"""What pinning costs on this machine: ``cudaHostRegister`` of 1 GiB in several kinds of memory, and the copy to
the GPU from each.

    python benchmarks/gpu/register_costs.py [--gib 1]

Kinds: anonymous memory (``torch.empty``); a memfd in 4 KiB pages mapped shared read-only (an entry's twin), its
registration repeated once its page tables exist; the same memfd with transparent huge pages asked for
(``MADV_HUGEPAGE``, where ``shmem_enabled`` allows it). Each row: registration seconds, pages migrated by the
kernel meanwhile (``/proc/vmstat`` ``pgmigrate_success``: a long-term pin moves pages out of ``ZONE_MOVABLE``
first), and the copy's GB/s. Also prints the zones' sizes and the THP settings. Needs CUDA.
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import time


def vmstat(name: str) -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k == name:
                return int(v)
    return 0


def meminfo(name: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def zones() -> str:
    out, zone = [], None
    with open("/proc/zoneinfo") as f:
        for line in f:
            parts = line.split()
            if line.startswith("Node"):
                zone = parts[-1]
            elif parts[:1] == ["present"] and zone:
                out.append(f"{zone} {int(parts[1]) * 4096 >> 20} MiB")
    return ", ".join(out)


def address_of(mm) -> int:
    probe = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(probe)
    del probe
    return addr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    args = ap.parse_args()
    import torch

    from overmind.shm import fdless, twins

    if not torch.cuda.is_available():
        print("register_costs.py: no CUDA device")
        return 2
    torch.zeros(1, device="cuda")
    size = int(args.gib * (1 << 30))
    print("zones:", zones())
    for p in ("enabled", "shmem_enabled"):
        try:
            print(f"THP {p}:", open(f"/sys/kernel/mm/transparent_hugepage/{p}").read().strip())
        except OSError as exc:
            print(f"THP {p}: {exc}")
    rows = []

    def measure(label: str, addr: int, keep_tensor) -> None:
        mig0, t0 = vmstat("pgmigrate_success"), time.perf_counter()
        code = twins.cuda_host_register(addr, size)
        reg = time.perf_counter() - t0
        migrated = vmstat("pgmigrate_success") - mig0
        copy = float("nan")
        if code == 0:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            keep_tensor.cuda()
            torch.cuda.synchronize()
            copy = time.perf_counter() - t0
            t0 = time.perf_counter()
            twins.cuda_host_unregister(addr)
            unreg = time.perf_counter() - t0
        else:
            unreg = float("nan")
        rows.append((label, code, reg, migrated, size / copy / 1e9 if copy == copy else float("nan"), unreg))
        print(f"  {label:<48} err {code:<3} register {reg:7.3f} s  migrated {migrated:>8} pages  "
              f"copy {rows[-1][4]:6.1f} GB/s  unregister {unreg:.3f} s", flush=True)

    anon = torch.full((size,), 7, dtype=torch.uint8)
    measure("anonymous (torch.empty, written)", anon.data_ptr(), anon)
    measure("anonymous, again", anon.data_ptr(), anon)
    del anon

    for huge in (False, True):
        fd = os.memfd_create(f"overmind-probe-{int(huge)}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        rw = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        if huge:
            rw.madvise(mmap.MADV_HUGEPAGE)
        shmem_huge0 = meminfo("ShmemHugePages")
        chunk = b"\x05" * (1 << 24)
        for off in range(0, size, len(chunk)):
            rw[off:off + len(chunk)] = chunk
        print(f"memfd huge={huge}: ShmemHugePages +{(meminfo('ShmemHugePages') - shmem_huge0) >> 10} MiB")
        twin = fdless.map_shared_readonly(fd, size)
        if huge:
            twin.madvise(mmap.MADV_HUGEPAGE)
        view = torch.frombuffer(twin, dtype=torch.uint8)
        kind = "THP asked" if huge else "4 KiB"
        measure(f"memfd {kind}, twin, page tables empty", address_of(twin), view)
        measure(f"memfd {kind}, twin, again", address_of(twin), view)
        _ = view[:: 4096].sum().item()  # fault every page in
        measure(f"memfd {kind}, twin, pages faulted in", address_of(twin), view)
        del view
        rw.close()
        os.close(fd)
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pinned.cuda()
    torch.cuda.synchronize()
    print(f"  pinned tensor (cudaHostAlloc) copy {size / (time.perf_counter() - t0) / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
