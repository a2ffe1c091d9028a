"""Where a warm load of the blog pipeline spends its time, measured three ways in fresh processes.

    python benchmarks/probes/profile_warm.py --scale full [--ckpt fp16] [-n 3]

1. One cold process (not measured) publishes the entries into a private server.
2. ``n`` warm processes each time the blog's four calls once (the first warm load of a process, what a user
   sees) with the garbage collector's own pauses recorded (``gc.callbacks``), then again with ``gc.freeze()``
   (every object from the imports moved out of the collector's sight), then profile one more load under
   cProfile and sum its time by where it is spent.

Prints a markdown report. cProfile inflates Python-heavy code, so its shares are read as proportions of
its own total, next to the unprofiled wall times.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BENCHMARKS, "harness"))

import harness  # noqa: E402
import report  # noqa: E402

# Buckets for the profile: the first pattern found in a function's "file:line(name)" names its bucket.
BUCKETS = [
    ("tokenizer rebuild (overmind-transformers)", ("tokenizer_reduce",)),
    ("pristine checks (pagemap reads)", ("shm/pagemap.py", "_is_pristine")),
    ("cache key (fingerprints, canon)", ("overmind/keys/key.py",)),
    ("tensor rebuild (torch._utils)", ("torch/_utils.py",)),
    ("the C unpickler itself (object graph)", ("_pickle.Unpickler",)),
    ("torch C calls (empty, set_, storages)", ("torch._C", "built-in method torch", "method 'set_'", "TensorBase")),
    ("storages over the mapping", ("native/zerocopy.py", "entries/pickling.py", "shm/reader.py")),
    ("client / socket", ("client/connection.py", "ipc/protocol.py", "socket")),
    ("module __setstate__ / configs", ("module.py", "configuration_utils.py", "conv.py")),
    ("adapter hooks", ("overmind_diffusers", "overmind_transformers", "overmind_bnb", "overmind_sfast", "adapters/hooks.py", "adapters/discovery.py")),
]

CHILD = r'''
import cProfile, gc, json, pstats, sys, time
import torch
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline
import overmind
overmind.activate()
ckpt, depth, edge = sys.argv[1:4]

def blog():
    vae = AutoencoderKL.from_pretrained(ckpt, subfolder="vae", torch_dtype=torch.float16)
    cn_depth = ControlNetModel.from_pretrained(depth, torch_dtype=torch.float16, variant="fp16")
    cn_edge = ControlNetModel.from_pretrained(edge, torch_dtype=torch.float16, variant="fp16")
    return StableDiffusionControlNetPipeline.from_pretrained(ckpt, vae=vae, controlnet=[cn_edge, cn_depth], torch_dtype=torch.float16, safety_checker=None)

gc_time = [0.0, 0]
_start = [0.0]
def on_gc(phase, info):
    if phase == "start":
        _start[0] = time.perf_counter()
    else:
        gc_time[0] += time.perf_counter() - _start[0]
        gc_time[1] += 1
gc.callbacks.append(on_gc)

out = {"tracked_objects": len(gc.get_objects())}
t = time.perf_counter(); pipe = blog(); out["first_s"] = time.perf_counter() - t
out["first_gc_s"], out["first_gc_runs"] = gc_time
del pipe
gc.collect(); gc_time[:] = [0.0, 0]
t = time.perf_counter(); pipe = blog(); out["second_s"] = time.perf_counter() - t
out["second_gc_s"] = gc_time[0]
del pipe
gc.collect(); gc.freeze()
t = time.perf_counter(); pipe = blog(); out["frozen_s"] = time.perf_counter() - t
del pipe
gc.unfreeze(); gc.collect()
prof = cProfile.Profile()
prof.enable(); pipe = blog(); prof.disable()
stats = pstats.Stats(prof).stats
out["profile"] = [[f"{k[0]}:{k[1]}({k[2]})", v[2]] for k, v in stats.items()]  # tottime per function
out["profile_total"] = sum(v[2] for v in stats.values())
print("PROFILE-RESULT:" + json.dumps(out), flush=True)
'''


def bucket_of(name: str) -> str:
    for title, patterns in BUCKETS:
        if any(p in name for p in patterns):
            return title
    return "other (pickle machinery, builtins)"


def _short(name: str) -> str:
    """``.../site-packages/torch/_utils.py:195(_rebuild_tensor)`` -> ``torch/_utils.py:195(_rebuild_tensor)``."""
    for marker in ("site-packages/", "/src/"):
        if marker in name:
            return name.split(marker, 1)[1]
    return name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=("small", "full"), default="small")
    ap.add_argument("--ckpt", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("-n", type=int, default=3)
    args = ap.parse_args(argv)
    root = os.path.join(BENCHMARKS, "fixtures", args.scale)
    argv3 = [os.path.join(root, f"sd15-{args.ckpt}"), os.path.join(root, "controlnet-depth"),
             os.path.join(root, "controlnet-edge")]
    h = harness.Harness(os.path.join(BENCHMARKS, "results", "logs", "profile-" + time.strftime("%Y%m%d-%H%M%S")))
    samples = []
    with h.runtime() as rt:
        h.run_child(os.path.join(BENCHMARKS, "scenarios", "blog.py"), argv3, "overmind", "profile-cold", runtime_dir=rt,
                    env=harness.ADMIT_FIRST)  # publishes
        env = {**os.environ, "OVERMIND_RUNTIME_DIR": rt, "HF_HUB_OFFLINE": "1"}  # the venv has no test adapters
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled bytecode, as in a user's process
        for i in range(args.n):
            proc = subprocess.run([sys.executable, "-c", CHILD, *argv3], env=env, capture_output=True, text=True,
                                  timeout=900)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROFILE-RESULT:")), None)
            if line is None:
                sys.exit(f"profile_warm.py: warm process failed:\n{proc.stderr[-3000:]}")
            samples.append(json.loads(line[len("PROFILE-RESULT:"):]))
            print(f"  warm {i + 1}/{args.n}: first {samples[-1]['first_s']:.3f} s", file=sys.stderr, flush=True)
    rows = ["| warm load of the blog pipeline, in-process | n | min | median | max |", "|---|---:|---:|---:|---:|"]
    for key, title in (("first_s", "first load in a fresh process"), ("first_gc_s", "of which garbage collection"),
                       ("second_s", "second load, same process"), ("frozen_s", "load after gc.freeze()")):
        n, lo, med, hi = report.summary(s[key] for s in samples)
        rows.append(f"| {title} (s) | {n} | {lo:.3f} | {med:.3f} | {hi:.3f} |")
    buckets: dict[str, list[float]] = {}
    for s in samples:
        sums: dict[str, float] = {}
        for name, tottime in s["profile"]:
            sums[bucket_of(name)] = sums.get(bucket_of(name), 0.0) + tottime
        for b, v in sums.items():
            buckets.setdefault(b, []).append(v / s["profile_total"])
    prof = ["| under cProfile: share of the load's time | median share |", "|---|---:|"]
    for b, shares in sorted(buckets.items(), key=lambda kv: -sorted(kv[1])[len(kv[1]) // 2]):
        prof.append(f"| {b} | {100 * report.summary(shares)[2]:.0f}% |")
    top: dict[str, list[float]] = {}
    for s in samples:
        for name, tottime in s["profile"]:
            top.setdefault(name, []).append(tottime / s["profile_total"])
    ranked = sorted(top.items(), key=lambda kv: -sum(kv[1]) / len(samples))[:12]
    prof += ["", "| under cProfile: functions by own time | mean share |", "|---|---:|"]
    prof += [f"| `{_short(name)}` | {100 * sum(v) / len(samples):.1f}% |" for name, v in ranked]
    m = harness.machine()
    print(f"### warm-load profile ({args.scale}, {args.ckpt})\n\n`python benchmarks/probes/profile_warm.py --scale "
          f"{args.scale} --ckpt {args.ckpt} -n {args.n}`\n\n" + "\n".join(rows) + "\n\n" + "\n".join(prof) +
          f"\n\nObjects tracked by the collector after the imports: {samples[0]['tracked_objects']:,}.\n\n"
          + report.machine_line(m) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
