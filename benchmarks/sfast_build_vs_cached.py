"""Build a stable-fast compiled pipeline vs get it from the Overmind cache, each in a fresh process.

    .venv/bin/python benchmarks/sfast_build_vs_cached.py [--ckpt FOLDER] [--repeat 3]

Without ``--ckpt`` it builds the team's tiny SD pipeline (tests/_support/tiny_models.py) into a temporary folder.
Rows (medians over ``--repeat`` fresh processes; the first cached process is run once):

* ``plain build``: ``build(ckpt)`` without Overmind (from_pretrained, compile, warm-up call that traces);
* ``cache, first``: ``overmind.load(build, ckpt)`` on an empty cache: builds, publishes, rebuilds;
* ``cache, warm``: ``overmind.load(build, ckpt)`` in a later process: maps and unpickles, no tracing.

Columns: seconds in ``build``/``load``, the first three renders after it, ``torch.jit.trace`` calls, and
the whole process (interpreter start and imports included).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"  # the repository's tests/: _support.sfast_pipelines, tiny_models

CHILD = """
import json, sys, time
sys.path.insert(0, {tests!r})
import overmind
from _support import sfast_pipelines as sp
overmind.activate()
counter = sp.TraceCounter()
with counter.installed():
    t = time.perf_counter()
    pipe = overmind.load(sp.build, {ckpt!r}) if {cached!r} else sp.build({ckpt!r})
    made = time.perf_counter() - t
    renders = []
    for _ in range(3):
        t = time.perf_counter()
        sp.render(pipe)
        renders.append(time.perf_counter() - t)
print("RESULT" + json.dumps({{"made": made, "renders": renders, "traces": counter.calls, "builds": sp.builds()}}))
"""


def run_child(ckpt: str, cached: bool, env: dict) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(TESTS), ckpt=ckpt, cached=cached)],
                         env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    return {**json.loads(line[len("RESULT"):]), "wall": wall}


def median_row(runs: list[dict]) -> dict:
    return {
        "made": statistics.median(r["made"] for r in runs),
        "renders": [statistics.median(r["renders"][i] for r in runs) for i in range(3)],
        "traces": max(r["traces"] for r in runs),
        "builds": max(r["builds"] for r in runs),
        "wall": statistics.median(r["wall"] for r in runs),
        "n": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", help="a diffusers StableDiffusionPipeline folder (default: a tiny one)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="om-bench-", dir="/tmp") as tmp:
        ckpt = args.ckpt
        if ckpt is None:
            sys.path.insert(0, str(TESTS))
            from _support.tiny_models import build_sd_pipeline

            ckpt = str(build_sd_pipeline(Path(tmp) / "ckpt"))
        env = {**os.environ, "OVERMIND_RUNTIME_DIR": os.path.join(tmp, "rt"), "OVERMIND_STRICT": "1",
               "OVERMIND_ADMIT": "first",  # "cache, first" publishes
               "HF_HUB_OFFLINE": "1"}
        os.makedirs(env["OVERMIND_RUNTIME_DIR"], mode=0o700)
        try:
            rows = {
                "plain build": median_row([run_child(ckpt, False, env) for _ in range(args.repeat)]),
                "cache, first": median_row([run_child(ckpt, True, env)]),
                "cache, warm": median_row([run_child(ckpt, True, env) for _ in range(args.repeat)]),
            }
        finally:
            subprocess.run([sys.executable, "-m", "overmind", "stop"], env=env, capture_output=True)

    print(f"ckpt: {ckpt if args.ckpt else 'tiny SD (tests/_support/tiny_models.py)'}; times in seconds, medians")
    print(f"{'':14} {'n':>2} {'build/load':>10} {'render 1':>9} {'render 2':>9} {'render 3':>9} "
          f"{'traces':>6} {'builds':>6} {'process':>8}")
    for name, r in rows.items():
        print(f"{name:14} {r['n']:>2} {r['made']:>10.3f} {r['renders'][0]:>9.3f} {r['renders'][1]:>9.3f} "
              f"{r['renders'][2]:>9.3f} {r['traces']:>6} {r['builds']:>6} {r['wall']:>8.2f}")


if __name__ == "__main__":
    main()
