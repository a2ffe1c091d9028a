"""Could a cold load publish from a forked snapshot, off the caller's path? What that would cost the caller.

    python benchmarks/probes/snapshot_publish.py --scale full [-n 5] [--ckpt fp16]

A publish pickles the result as it was when the loader returned, and a cold load pays for that pickle before it
returns (``publish`` in the blog scenarios' step tables). A child forked at that moment holds exactly that state,
copy-on-write, so it could pickle and publish while the caller goes on. This measures what the caller would
still pay, with no Overmind loaded at all: fresh processes, the three modes alternated (the order rotates every
repetition), each running the blog's four calls plainly:

* ``plain``: nothing else;
* ``fork, idle child``: after each call, fork a child that sleeps 2 s and exits: the fork itself and the
  copy-on-write faults the caller takes afterwards on the pages it shares with the child;
* ``fork, pickling child``: after each call, fork a child that pickles the call's result as a publish does
  (``overmind.entries.pickling.dumps`` with the installed adapters' reducers; nothing written), then exits: the
  above, and the child's work competing with the caller for the machine's cores.

Prints the four calls' time per mode, and each fork mode against the plain process of its repetition.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("plain", "fork, idle child", "fork, pickling child")


def inner(mode: str, ckpt: str, depth: str, edge: str) -> None:
    """One process of ``mode``: the blog's four calls, timed; prints ``{"calls_s": ..., "fork_ms": [...]}``."""
    import torch
    from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline

    reducers = None
    if mode == MODES[2]:
        from overmind.adapters import hooks
        from overmind.entries import pickling

        reducers = hooks.reducers()
    forks: list[tuple[int, float]] = []

    def snapshot(result) -> None:
        if mode == MODES[0]:
            return
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if reducers is None:
                    time.sleep(2.0)
                else:
                    pickling.dumps(result, reducers)
            except BaseException:
                code = 1
            os._exit(code)
        forks.append((pid, time.perf_counter() - t))

    t0 = time.perf_counter()
    vae = AutoencoderKL.from_pretrained(ckpt, subfolder="vae", torch_dtype=torch.float16)
    snapshot(vae)
    cn_depth = ControlNetModel.from_pretrained(depth, torch_dtype=torch.float16, variant="fp16")
    snapshot(cn_depth)
    cn_edge = ControlNetModel.from_pretrained(edge, torch_dtype=torch.float16, variant="fp16")
    snapshot(cn_edge)
    pipe = StableDiffusionControlNetPipeline.from_pretrained(ckpt, vae=vae, controlnet=[cn_edge, cn_depth],
                                                             torch_dtype=torch.float16, safety_checker=None)
    snapshot(pipe)
    calls_s = time.perf_counter() - t0
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid, _ in forks)
    print(json.dumps({"calls_s": calls_s, "fork_ms": [f * 1e3 for _, f in forks], "children_failed": failed}))


def one(mode: str, paths: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERMIND_")}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--inner", mode, *paths], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=600)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(f"snapshot_publish: the {mode!r} process exited {proc.returncode}")
    sample = json.loads(proc.stdout.strip().splitlines()[-1])
    if sample["children_failed"]:
        raise SystemExit(f"snapshot_publish: {sample['children_failed']} forked children failed in {mode!r}")
    return sample


def row(label: str, xs: list[float], unit: str = "s") -> str:
    f = (lambda x: f"{x:.3f}") if unit == "s" else (lambda x: f"{x:.2f}x")
    return f"| {label} | {len(xs)} | {f(min(xs))} | {f(statistics.median(xs))} | {f(max(xs))} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inner", nargs=4, metavar=("MODE", "CKPT", "DEPTH", "EDGE"), help=argparse.SUPPRESS)
    ap.add_argument("--scale", choices=("small", "full"), default="full")
    ap.add_argument("--ckpt", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    if args.inner:
        inner(*args.inner)
        return 0
    benchmarks = os.path.dirname(HERE)
    sys.path[:0] = [os.path.join(benchmarks, "harness"), os.path.join(benchmarks, "fixtures")]
    import harness
    import make_fixture
    import report

    root = make_fixture.fixture_dir(args.scale)
    paths = [os.path.join(root, f"sd15-{args.ckpt}"), os.path.join(root, "controlnet-depth"),
             os.path.join(root, "controlnet-edge")]
    missing = [p for p in paths if not os.path.isdir(p)]
    if missing:
        raise SystemExit(f"snapshot_publish: no fixture at {missing[0]}; run benchmarks/fixtures/make_fixture.py "
                         f"--scale {args.scale}")
    machine = harness.machine()  # the load average at the start
    one(MODES[0], paths)  # uncounted: the checkpoints into the page cache
    samples: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(args.n):
        k = rep % len(MODES)
        for mode in MODES[k:] + MODES[:k]:
            samples[mode].append(one(mode, paths))
    print(f"### snapshot publish: forking after each of the blog's calls ({args.scale}, {args.ckpt})\n")
    print(f"`python benchmarks/probes/snapshot_publish.py --scale {args.scale} --ckpt {args.ckpt} -n {args.n}`\n")
    print("| the 4 calls, plain diffusers (s) | n | min | median | max |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES:
        print(row(mode, [s["calls_s"] for s in samples[mode]]))
    print("\n| against plain (pair by pair) | n | min | median | max |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES[1:]:
        ratios = [s["calls_s"] / p["calls_s"] for s, p in zip(samples[mode], samples[MODES[0]])]
        print(row(f"{mode} / plain", ratios, "x"))
    forks = [f for mode in MODES[1:] for s in samples[mode] for f in s["fork_ms"]]
    print(f"\n`os.fork()` in the caller: median {statistics.median(forks):.1f} ms, max {max(forks):.1f} ms "
          f"({len(forks)} forks).\n")
    print(report.machine_line(machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
