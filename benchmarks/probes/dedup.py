"""What identical-bytes dedup costs a cold load and what it saves (``overmind.entries.dedup``).

    python benchmarks/probes/dedup.py [--mib 384] [--reps 3]

A model of ``--mib`` MiB of fp32 weights is built in code (``nn.Linear(2048, 2048)`` layers, 16 MiB each) and
published through a private server by four loaders, in this order:

- ``first``: the model (nothing to share yet: the cost of keying when nothing is found);
- ``other_loader``: the same weights through another loader (another key): every weight found;
- ``twin``: the model with its middle layer changed: all but that layer found;
- ``unrelated``: another seed, same shapes (same sizes, other bytes: keys differ, nothing compared).

Each is run with ``OVERMIND_DEDUP`` on and off, each repetition on a fresh server. The table gives the median
seconds of the publish steps (``pickle``, ``dedup``, ``write_entry``, the whole ``publish``), the entry's bytes,
what dedup keyed, compared and did not write, and the speed of keying (sampled bytes hashed per second, and
storage bytes keyed per second) and of the compare. A second table gives, for reference, full hashes over the
same bytes (what a hash of every byte would cost): SHA-256 and BLAKE2b, one thread and two.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import threading
import time

import torch

WIDTH = 2048
LAYER_MIB = WIDTH * WIDTH * 4 >> 20


def _net(seed: int, layers: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    with torch.no_grad():
        return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))


def first(layers):
    return _net(0, layers)


def other_loader(layers):
    return torch.nn.Sequential(*list(_net(0, layers).children()))


def twin(layers):
    net = _net(0, layers)
    with torch.no_grad():
        net[layers // 2].weight.mul_(2)
    return net


def unrelated(layers):
    return _net(1, layers)


LOADERS = (first, other_loader, twin, unrelated)


class Timers:
    """Inclusive timers around the publish steps, and the dedup plans made."""

    def __init__(self) -> None:
        import overmind.entries.dedup
        import overmind.entries.pickling
        import overmind.loading.publish
        import overmind.shm.writer

        self.t: dict[str, float] = {}
        self.plans: list = []
        for name, owner, attr in (("pickle", overmind.entries.pickling, "dumps"), ("write_entry", overmind.shm.writer,
                                  "write_entry"), ("publish", overmind.loading.publish, "publish"),
                                  ("dedup", overmind.entries.dedup, "plan")):
            setattr(owner, attr, self._wrap(name, getattr(owner, attr)))

    def _wrap(self, name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                out = fn(*a, **k)
            finally:
                self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - t
            if name == "dedup":
                self.plans.append(out)
            return out
        return timed

    def take(self) -> tuple[dict[str, float], list]:
        t, plans = self.t, self.plans
        self.t, self.plans = {}, []
        return t, plans


def one_rep(layers: int, dedup_on: bool, timers: Timers) -> dict[str, dict]:
    import overmind
    from overmind.client.connection import get_client
    from overmind.testing import isolated_runtime

    os.environ["OVERMIND_DEDUP"] = "1" if dedup_on else "0"
    rows = {}
    with isolated_runtime():
        for loader in LOADERS:
            timers.take()
            obj = overmind.load(loader, layers)
            t, plans = timers.take()
            [entry] = [e for e in get_client().ls() if e["meta"]["loader"].endswith("." + loader.__name__)]
            p = plans[0] if plans else None
            rows[loader.__name__] = dict(
                t, nbytes=entry["nbytes"], keyed=getattr(p, "keyed", 0), compared=getattr(p, "compared", 0),
                saved=getattr(p, "saved", 0), key_s=getattr(p, "key_seconds", 0.0),
                compare_s=getattr(p, "compare_seconds", 0.0))
            del obj
    return rows


def full_hash_rates(nbytes_mib: int) -> list[tuple[str, float]]:
    buf = torch.randint(0, 255, (nbytes_mib << 20,), dtype=torch.uint8)
    view = memoryview(buf.numpy())
    out = []
    for name in ("sha256", "blake2b"):
        t = time.perf_counter()
        hashlib.new(name, view).digest()
        out.append((f"{name}, 1 thread", len(view) / (time.perf_counter() - t) / 2**30))
        half = len(view) // 2
        threads = [threading.Thread(target=lambda v, h=name: hashlib.new(h, v).digest(), args=(v,))
                   for v in (view[:half], view[half:])]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out.append((f"{name}, 2 threads", len(view) / (time.perf_counter() - t) / 2**30))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=384)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    layers = max(3, args.mib // LAYER_MIB)
    from overmind.entries import dedup

    timers = Timers()
    runs: dict[tuple[str, bool], list[dict]] = {}
    load0 = os.getloadavg()[0]
    for _ in range(args.reps):
        for on in (True, False):
            for name, row in one_rep(layers, on, timers).items():
                runs.setdefault((name, on), []).append(row)
    load1 = os.getloadavg()[0]

    def med(xs):
        return statistics.median(xs) if xs else 0.0

    gib = 2**30
    print(f"model: {layers} x Linear({WIDTH}, {WIDTH}) fp32 = {layers * LAYER_MIB} MiB; {args.reps} repetitions; "
          f"load average {load0:.2f} -> {load1:.2f}; torch {torch.__version__}, {os.cpu_count()} CPUs\n")
    print("| loader | dedup | publish s | pickle s | dedup s | write_entry s | entry MiB | keyed MiB | compared MiB "
          "| not written MiB | keying: sampled MiB/s | keying: storage GiB/s | compare GiB/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for loader in LOADERS:
        for on in (True, False):
            rs = runs[(loader.__name__, on)]
            row = {k: med([r.get(k, 0.0) for r in rs]) for k in rs[0]}
            sampled = layers * dedup.SAMPLES * dedup.CHUNK  # the weights are keyed (the 8 KiB biases are not)
            key_rate = f"{sampled / row['key_s'] / 2**20:.0f}" if on and row["key_s"] else ""
            storage_rate = f"{row['keyed'] / row['key_s'] / gib:.1f}" if on and row["key_s"] else ""
            cmp_rate = f"{row['compared'] / row['compare_s'] / gib:.1f}" if on and row["compared"] else ""
            print(f"| {loader.__name__} | {'on' if on else 'off'} | {row.get('publish', 0):.3f} | "
                  f"{row.get('pickle', 0):.3f} | {row.get('dedup', 0):.4f} | {row.get('write_entry', 0):.3f} | "
                  f"{row['nbytes'] / 2**20:.1f} | {row['keyed'] / 2**20:.0f} | {row['compared'] / 2**20:.0f} | "
                  f"{row['saved'] / 2**20:.0f} | {key_rate} | {storage_rate} | {cmp_rate} |")
    print("\nFor reference, a hash of every byte (what keying by a full hash would cost):\n")
    print("| hash | GiB/s |")
    print("|---|---:|")
    for name, rate in full_hash_rates(min(args.mib, 256)):
        print(f"| {name} | {rate:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
