"""CPU time of a warm blog load, step by step, in fresh processes (for a shared machine, where wall time lies).

    .venv/bin/python benchmarks/warm_cpu.py --scale full [-n 8]

One cold process (``scenarios/blog.py``, not measured) publishes the blog's four entries into a private server;
then ``n`` fresh processes each run the four calls once, in the blog's order (``activate()`` before the
imports), and report per step both ``time.process_time`` (this process's CPU, what other processes on the
machine cannot inflate) and wall time, summed over the four calls: ``key``, ``server_get``, ``map``,
``unpickle`` and inside it ``tokenizer`` (the fast tokenizer's rebuild, not its unpickling), ``remember``
(the provenance snapshot of each result) and ``load`` (a call after its key). Per-storage or per-tensor steps
are not timed: two clock reads for each of 1,800 storages would add milliseconds of their own. Prints a
markdown table (medians, min-max) with the load average at start and end.

Mind ``PYTHONDONTWRITEBYTECODE``: with it set, every module edited since its ``.pyc`` was written is compiled
again in every process, inside whichever load imports it first (``overmind.client.connection``: 4.5 ms). Set
``PYTHONPYCACHEPREFIX`` to a private folder and unset it to measure what an installed package costs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import report  # noqa: E402

STEPS = {  # name -> (module, attribute path); timed at their outermost call only
    "key": ("overmind.keys.key", "make_key"),
    "server_get": ("overmind.client.connection", "Client.get"),
    "map": ("overmind.shm.reader", "EntryMapping.__init__"),
    "unpickle": ("overmind.entries.pickling", "loads"),
    "tokenizer": ("overmind_transformers.tokenizer_reduce", "rebuild_fast_tokenizer"),
    "remember": ("overmind.keys.provenance", "remember_origin"),
    "load": ("overmind.loading.flow", "_cached_call"),
}

CHILD = r'''
import functools, importlib, json, os, sys, time
import overmind
overmind.activate()
import torch
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline
ckpt, depth, edge = sys.argv[1:4]
steps = json.loads(sys.argv[4])
cpu, wall, depth_ = {}, {}, {}
def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        d = depth_.get(name, 0); depth_[name] = d + 1
        c, t = time.process_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            depth_[name] = d
            if d == 0:
                cpu[name] = cpu.get(name, 0.0) + time.process_time() - c
                wall[name] = wall.get(name, 0.0) + time.perf_counter() - t
    return wrapper
for name, (module, path) in steps.items():
    owner = importlib.import_module(module)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    setattr(owner, attr, timed(name, getattr(owner, attr)))
c, t = time.process_time(), time.perf_counter()
vae = AutoencoderKL.from_pretrained(ckpt, subfolder="vae", torch_dtype=torch.float16)
cn_depth = ControlNetModel.from_pretrained(depth, torch_dtype=torch.float16, variant="fp16")
cn_edge = ControlNetModel.from_pretrained(edge, torch_dtype=torch.float16, variant="fp16")
pipe = StableDiffusionControlNetPipeline.from_pretrained(ckpt, vae=vae, controlnet=[cn_edge, cn_depth], torch_dtype=torch.float16, safety_checker=None)
cpu["the 4 calls"], wall["the 4 calls"] = time.process_time() - c, time.perf_counter() - t
print("WARM-CPU:" + json.dumps({"cpu": cpu, "wall": wall, "hit": "load" in cpu and "unpickle" in cpu}), flush=True)
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=("small", "full"), default="small")
    ap.add_argument("-n", type=int, default=8)
    args = ap.parse_args(argv)
    root = os.path.join(HERE, "fixtures", args.scale)
    paths = [os.path.join(root, "sd15-fp16"), os.path.join(root, "controlnet-depth"), os.path.join(root, "controlnet-edge")]
    h = harness.Harness(os.path.join(HERE, "results", "logs", "warm-cpu"))
    start, m = os.getloadavg(), harness.machine()
    samples = []
    with h.runtime() as rt:
        h.run_child(os.path.join(HERE, "scenarios", "blog.py"), [*paths, "--activate-first"], "overmind", "warm-cpu-cold",
                    runtime_dir=rt, env=harness.ADMIT_FIRST)  # publishes
        env = {**os.environ, "OVERMIND_RUNTIME_DIR": rt, "HF_HUB_OFFLINE": "1", "DIFFUSERS_VERBOSITY": "error",
               "OVERMIND_DISABLED_ADAPTERS": os.environ.get("OVERMIND_DISABLED_ADAPTERS", "fixture,fixture_broken")}
        for i in range(args.n):
            proc = subprocess.run([sys.executable, "-c", CHILD, *paths, json.dumps(STEPS)], env=env,
                                  capture_output=True, text=True, timeout=900)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("WARM-CPU:")), None)
            if line is None:
                sys.exit(f"warm_cpu.py: warm process failed:\n{proc.stderr[-3000:]}")
            sample = json.loads(line[len("WARM-CPU:"):])
            if not sample["hit"]:
                sys.exit("warm_cpu.py: a warm process missed the cache (see its stderr)")
            samples.append(sample)
            print(f"  warm {i + 1}/{args.n}: cpu {sample['cpu']['the 4 calls']:.3f} s, wall "
                  f"{sample['wall']['the 4 calls']:.3f} s", file=sys.stderr, flush=True)
    end = os.getloadavg()
    rows = ["| warm blog, fresh process (s) | CPU median | CPU min-max | wall median | wall min-max |",
            "|---|---:|---:|---:|---:|"]
    for name in ["the 4 calls", *STEPS]:
        cpus = [s["cpu"].get(name, 0.0) for s in samples]
        walls = [s["wall"].get(name, 0.0) for s in samples]
        _, clo, cmed, chi = report.summary(cpus)
        _, wlo, wmed, whi = report.summary(walls)
        rows.append(f"| {name} | {cmed:.3f} | {clo:.3f}-{chi:.3f} | {wmed:.3f} | {wlo:.3f}-{whi:.3f} |")
    print(f"### warm blog load, CPU time ({args.scale}, n={args.n})\n\n`python benchmarks/warm_cpu.py --scale "
          f"{args.scale} -n {args.n}`\n\n" + "\n".join(rows) + f"\n\nLoad average: {start[0]:.1f} at start, "
          f"{end[0]:.1f} at end; PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}.\n\n"
          + report.machine_line(m) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
