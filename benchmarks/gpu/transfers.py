"""Copies of cached weights to a GPU: bandwidth, memory shared across processes, and exactness after a write.

    python benchmarks/gpu/transfers.py [--gib 4] [--pss-gib 2] [--json OUT.json]

A module of ``--gib`` GiB of fp16 weights in 1,000 tensors of mixed sizes (about what the blog's pipeline
holds) is built by ``build()``, plainly or through ``overmind.load``, each case in a fresh process against a
private server, and moved with ``module.to("cuda")`` (device synchronised on both sides). Rows:

* ``plain``: the module built in the process (pageable anonymous memory), as a plain load leaves it;
* ``pinned tensor``: one pinned tensor of the same size, ``.cuda()``: the host-to-device ceiling of this run;
* ``warm, pageable``: a hit with ``OVERMIND_PINNED_COPIES=0``: copied from the private mapping;
* ``warm, pinned twin``: a hit, copied from the read-only shared twin (``overmind.shm.twins``), the driver's
  registration included in the time; ``warm, pinned twin (registered before)`` splits registration and copy;
* ``warm, private mapping registered``: for comparison, the private mapping itself registered read-only.

Then memory: ``--processes`` processes each hold a hit's CPU tensors and their GPU copy, and the sum of their
PSS (``/proc/PID/smaps_rollup``) is compared with plain processes doing the same. Then exactness: a hit's
parameter written in place on the CPU after the twin was registered, then ``.to("cuda")``: the GPU must hold
the written values (and the same for the private-registration design, which is reported, not asserted).

Prints a table; ``--json`` writes the rows and checks. Exit status 1 if a check fails, 2 without CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "TRANSFER-RESULT:"
CUDA_HOST_REGISTER_PORTABLE_READ_ONLY = 0x01 | 0x08


# ---- in the child process ----------------------------------------------------------------------------------
def build(gib: float):
    """1,000 fp16 tensors (sizes cycling through 1..13 units) adding up to ``gib`` GiB, values i % 251."""
    import torch

    sizes = [(i % 13) + 1 for i in range(1000)]
    unit = int(gib * (1 << 30)) // (2 * sum(sizes))
    module = torch.nn.Module()
    for i, n in enumerate(sizes):
        t = torch.empty(n * unit, dtype=torch.float16)
        t.copy_(torch.arange(n * unit, dtype=torch.int32).remainder_(251 - i % 7))
        module.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))
    return module


def _child(mode: str, gib: float, hold: bool, write: bool) -> dict:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out: dict = {"mode": mode}
    if mode == "pinned tensor":
        nbytes = int(gib * (1 << 30))
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        src.fill_(3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst = src.cuda()
        torch.cuda.synchronize()
        out.update(bytes=nbytes, seconds=time.perf_counter() - t0, ok=bool(dst[-1].item() == 3))
        return out
    if mode == "plain":
        module = build(gib)
    else:
        import overmind

        t0 = time.perf_counter()
        module = overmind.load(build, gib)
        out["load_s"] = time.perf_counter() - t0
    params = list(module.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)
    keep = [p.data for p in params]  # the CPU tensors stay alive (and mapped) after the move
    if mode == "warm, private mapping registered":
        t0 = time.perf_counter()
        out["registered_bytes"] = _register_private_mappings(torch)
        out["register_s"] = time.perf_counter() - t0
    if mode == "warm, pinned twin (registered before)":
        from overmind.shm import twins

        t0 = time.perf_counter()
        pinned = twins.pinned_storages([p.untyped_storage() for p in params])
        out["register_s"] = time.perf_counter() - t0
        out["pinned_storages"] = len(pinned)
        del pinned
    expected = None
    if write:  # an in-place write on the CPU after registration, before the move
        with torch.no_grad():
            params[5].data.add_(1)
            params[500].data[7:4000] = -2
        expected = {i: params[i].detach().clone() for i in (5, 500, 6)}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    module.to("cuda")
    torch.cuda.synchronize()
    out.update(bytes=nbytes, seconds=time.perf_counter() - t0)
    moved = list(module.parameters())
    out["devices"] = sorted({str(p.device) for p in moved})
    if expected is not None:
        out["exact"] = {str(i): bool(torch.equal(moved[i].cpu(), v)) for i, v in expected.items()}
    if mode.startswith("warm, pinned twin"):
        from overmind.shm import twins

        state = twins.state()
        out["twins"], out["registered_twins"], out["registered_bytes"] = state
    out["checksum"] = float(sum(p.float().sum().item() for p in moved[:20]))
    if hold:
        print(MARK + json.dumps(out), flush=True)
        sys.stdin.read()  # the parent reads this process's PSS, then closes stdin
    del keep
    return out


def _register_private_mappings(torch) -> int:
    from overmind.shm import twins

    total = 0
    with open("/proc/self/maps") as f:
        lines = [line for line in f if "memfd:overmind" in line]
    for line in lines:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if twins.cuda_host_register(lo, hi - lo, CUDA_HOST_REGISTER_PORTABLE_READ_ONLY) == 0:
            total += hi - lo
    return total


# ---- in the parent -----------------------------------------------------------------------------------------
def _env(runtime: str, mode: str) -> dict:
    env = {**os.environ, "OVERMIND_RUNTIME_DIR": runtime, "OVERMIND_MAX_BYTES": "48G", "PYTHONUNBUFFERED": "1",
           "OVERMIND_ADMIT": "first"}  # the cold run publishes the entry the others map
    env["OVERMIND_PINNED_COPIES"] = "0" if mode in ("warm, pageable", "warm, private mapping registered") else "1"
    return env


def _run(mode: str, gib: float, runtime: str, write: bool = False) -> dict:
    argv = [sys.executable, __file__, "--child", mode, "--gib", str(gib)] + (["--write"] if write else [])
    proc = subprocess.run(argv, env=_env(runtime, mode), capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss line for {pid}")


def _pss_by_kind(pid: int) -> dict:
    """PSS (MiB) of one process by kind of mapping: an entry's twin (shared memfd), its private mapping,
    anonymous memory, the rest."""
    out: dict[str, float] = {}
    kind = "other"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split()
            if first and "-" in first[0] and len(first) >= 5 and not first[0].endswith(":"):
                name = " ".join(first[5:])
                perms = first[1]
                if "memfd:overmind" in name:
                    kind = "entry twin (shared)" if perms.endswith("s") else "entry private mapping"
                elif not name:
                    kind = "anonymous"
                else:
                    kind = "other"
            elif first[:1] == ["Pss:"]:
                out[kind] = out.get(kind, 0.0) + int(first[1]) / 1024
    return {k: round(v) for k, v in out.items()}


def _held_pss(mode: str, gib: float, runtime: str, n: int) -> float:
    """Sum of PSS (MiB) of ``n`` processes each holding ``mode``'s module on the GPU and its CPU tensors."""
    argv = [sys.executable, __file__, "--child", mode, "--gib", str(gib), "--hold"]
    procs = [subprocess.Popen(argv, env=_env(runtime, mode), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            line = p.stdout.readline()
            while line and not line.startswith(MARK):
                line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{mode}: a holder exited early\n{p.stderr.read()[-3000:]}")
        print(f"  one holder of {mode}, PSS by mapping (MiB): {_pss_by_kind(procs[0].pid)}", file=sys.stderr,
              flush=True)
        return sum(_pss_kib(p.pid) for p in procs) / 1024
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)


def measure(gib: float, pss_gib: float, processes: int) -> dict:
    import torch

    runtime = tempfile.mkdtemp(prefix="om-gpu-transfers-", dir="/tmp")
    rows, checks = [], []
    try:
        _run("cold", gib, runtime)  # publishes the entry
        for mode in ("plain", "pinned tensor", "warm, pageable", "warm, pinned twin",
                     "warm, pinned twin (registered before)", "warm, private mapping registered"):
            r = _run(mode, gib, runtime)
            r["gb_per_s"] = r["bytes"] / r["seconds"] / 1e9
            rows.append(r)
            print(f"  {mode:<42} {r['seconds']:.3f} s  {r['gb_per_s']:6.1f} GB/s", file=sys.stderr, flush=True)
        by = {r["mode"]: r for r in rows}
        plain, pinned, twin = by["plain"], by["pinned tensor"], by["warm, pinned twin"]
        checks.append({"name": "warm .to('cuda') from the twin at >= 80 % of the pinned tensor's bandwidth",
                       "ok": twin["gb_per_s"] >= 0.8 * pinned["gb_per_s"],
                       "detail": f"{twin['gb_per_s']:.1f} vs {pinned['gb_per_s']:.1f} GB/s (registration included)"})
        checks.append({"name": "warm .to('cuda') from the twin at least 3x faster than plain",
                       "ok": plain["seconds"] >= 3 * twin["seconds"],
                       "detail": f"{plain['seconds']:.3f} s plain, {twin['seconds']:.3f} s warm"})
        checks.append({"name": "the same values on the GPU (first 20 tensors' sum) in every case",
                       "ok": len({r["checksum"] for r in rows if "checksum" in r}) == 1,
                       "detail": str(sorted({r["checksum"] for r in rows if "checksum" in r}))})
        _run("cold", 1.0, runtime)
        for mode in ("warm, pinned twin (registered before)", "warm, private mapping registered"):
            r = _run(mode, 1.0, runtime, write=True)
            exact = all(r["exact"].values())
            name = f"{mode}: a CPU write after registration reaches the GPU copy"
            if mode.startswith("warm, pinned"):
                checks.append({"name": name, "ok": exact and r["registered_bytes"] > 0,
                               "detail": json.dumps(r["exact"]) + f", {r['registered_bytes']} bytes registered"})
            else:
                checks.append({"name": name + " (the rejected design; reported, not required)", "ok": None,
                               "detail": json.dumps(r["exact"])})
        pss = {"processes": processes, "gib_each": pss_gib}
        _run("cold", pss_gib, runtime)
        for mode in ("plain", "warm, pinned twin", "warm, private mapping registered"):
            pss[mode] = _held_pss(mode, pss_gib, runtime, processes)
            print(f"  PSS of {processes} holders, {mode}: {pss[mode]:.0f} MiB", file=sys.stderr, flush=True)
        weights_mib = pss_gib * 1024
        checks.append({"name": f"{processes} processes on the GPU from pinned twins hold one copy of the weights",
                       "ok": pss["warm, pinned twin"] < weights_mib * 1.5 + 512 * processes,
                       "detail": f"sum of PSS {pss['warm, pinned twin']:.0f} MiB for {weights_mib:.0f} MiB of "
                                 f"weights; plain {pss['plain']:.0f} MiB"})
    finally:
        subprocess.run([sys.executable, "-m", "overmind", "stop"], env={**os.environ, "OVERMIND_RUNTIME_DIR": runtime},
                       capture_output=True, timeout=60)
    return {"machine": f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {os.cpu_count()} CPUs",
            "bandwidth": [{"path": r["mode"], "bytes": r["bytes"], "seconds": r["seconds"],
                           "gb_per_s": r["gb_per_s"], **{k: r[k] for k in ("register_s", "registered_bytes", "load_s")
                                                         if k in r}} for r in rows],
            "pss_mib": {"processes": processes, "sum_pss": pss["warm, pinned twin"], "plain_sum_pss": pss["plain"],
                        "private_registered_sum_pss": pss["warm, private mapping registered"],
                        "gib_each": pss_gib},
            "checks": checks}


def table(result: dict) -> str:
    lines = ["| path | GiB | seconds | GB/s | registration s |", "|---|--:|--:|--:|--:|"]
    for r in result["bandwidth"]:
        reg = f"{r['register_s']:.3f}" if "register_s" in r else ""
        lines.append(f"| {r['path']} | {r['bytes'] / (1 << 30):.2f} | {r['seconds']:.3f} | {r['gb_per_s']:.1f} | {reg} |")
    p = result["pss_mib"]
    lines += ["", f"Sum of PSS of {p['processes']} processes holding {p['gib_each']} GiB each on the GPU and on the "
                  f"CPU: pinned twins {p['sum_pss']:.0f} MiB, plain {p['plain_sum_pss']:.0f} MiB, private mapping "
                  f"registered {p['private_registered_sum_pss']:.0f} MiB", ""]
    lines += [f"- {'PASS' if c['ok'] else ('info' if c['ok'] is None else 'FAIL')}: {c['name']} ({c['detail']})"
              for c in result["checks"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--pss-gib", type=float, default=2.0)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("--pss-only", action="store_true", help="only the memory of --processes holders per mode")
    ap.add_argument("--child")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        if args.child == "cold":
            import overmind

            overmind.load(build, args.gib)
            print(MARK + json.dumps({"mode": "cold"}))
            return 0
        result = _child(args.child, args.gib, args.hold, args.write)
        print(MARK + json.dumps(result), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("transfers.py: no CUDA device here; nothing measured")
        return 2
    if args.pss_only:
        runtime = tempfile.mkdtemp(prefix="om-gpu-pss-", dir="/tmp")
        try:
            _run("cold", args.pss_gib, runtime)
            for mode in ("warm, pinned twin", "warm, private mapping registered", "warm, pageable", "plain"):
                total = _held_pss(mode, args.pss_gib, runtime, args.processes)
                print(f"PSS of {args.processes} holders of {args.pss_gib} GiB, {mode}: {total:.0f} MiB", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "overmind", "stop"],
                           env={**os.environ, "OVERMIND_RUNTIME_DIR": runtime}, capture_output=True, timeout=60)
        return 0
    result = measure(args.gib, args.pss_gib, args.processes)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if any(c["ok"] is False for c in result["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
