"""What ``import overmind`` and ``overmind.activate()`` cost a fresh process that has imported no ML library.

    .venv/bin/python benchmarks/probes/activate.py [-n 20] [--with-test-adapters]

Runs ``-n`` fresh processes of each of: bare python (``pass``), ``import overmind``, ``import overmind;
overmind.activate()``, in turn (round robin, so that a drift in the machine's speed touches all three alike).
Prints, in milliseconds, the median and minimum of two figures: the whole process, spawn to exit, as the
parent sees it; and the statement alone, timed inside the child (``time.perf_counter`` around it). The
"over bare python" column is the median whole process less bare python's median. The load average before
and after is printed: on a busy machine every figure is larger.

The process sees what a user's would: the adapters installed in this Python. ``--with-test-adapters`` puts the
test-only adapters (``tests/adapter_fixture*``, copied into ``.test-plugins`` by ``scripts/setup``) on
``PYTHONPATH`` as the test suite does; the fixture adapter instruments its own module, which it imports with
its plugin, so activation patches it at once and imports torch (its library's import, not activation's):
``--with-test-adapters --disable fixture,fixture_broken`` times their discovery without that.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_PLUGINS = os.path.join(ROOT, ".test-plugins")

CHILD = r'''
import sys, time
t = time.perf_counter()
{statement}
t = time.perf_counter() - t
{report}
print("T:%.9f" % t)
'''

CASES = [
    ("bare python", "pass", ""),
    ("import overmind", "import overmind", ""),
    ("import overmind; overmind.activate()", "import overmind\nactive = overmind.activate()",
     'print("A:" + ",".join(active)); print("M:%d" % ("torch" in sys.modules))'),
]


def one_run(statement: str, report: str, env: dict) -> dict:
    code = CHILD.format(statement=statement, report=report)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    process = time.perf_counter() - t
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {"process": process, "statement": float(lines["T"]), "active": lines.get("A"),
            "torch": lines.get("M") == "1"}


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20, help="fresh processes per case (default 20)")
    ap.add_argument("--with-test-adapters", action="store_true",
                    help="put the test-only adapters (.test-plugins) on PYTHONPATH, as the test suite does")
    ap.add_argument("--disable", default="", help="adapters to skip by name (OVERMIND_DISABLED_ADAPTERS)")
    ap.add_argument("--json", help="also write the raw samples here")
    args = ap.parse_args(argv)

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.with_test_adapters:
        if not os.path.isdir(TEST_PLUGINS):
            sys.exit(f"activate.py: no {TEST_PLUGINS}; scripts/setup makes it")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TEST_PLUGINS, env.get("PYTHONPATH")) if p)
    if args.disable:
        env["OVERMIND_DISABLED_ADAPTERS"] = args.disable

    load_before = os.getloadavg()
    samples: dict[str, list[dict]] = {name: [] for name, _, _ in CASES}
    for _ in range(2):  # warm-up: the page cache and the .pyc files
        for _, statement, report in CASES:
            one_run(statement, report, env)
    for _ in range(args.n):
        for name, statement, report in CASES:
            samples[name].append(one_run(statement, report, env))
    load_after = os.getloadavg()

    bare = statistics.median(s["process"] for s in samples["bare python"])
    print(f"python {sys.version.split()[0]}, {args.n} fresh processes per case, "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (1 min)")
    last = samples[CASES[-1][0]][-1]
    print(f"adapters active: {last['active'] or '(none)'}; torch imported by activate(): {last['torch']}"
          + ("; test-only adapters on PYTHONPATH" if args.with_test_adapters else "")
          + (f"; disabled: {args.disable}" if args.disable else ""))
    print()
    print("| case | process median ms | process min ms | over bare python ms | statement median ms | "
          "statement min ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _, _ in CASES:
        proc = [s["process"] for s in samples[name]]
        stmt = [s["statement"] for s in samples[name]]
        over = "" if name == "bare python" else ms(statistics.median(proc) - bare)
        print(f"| {name} | {ms(statistics.median(proc))} | {ms(min(proc))} | {over} | "
              f"{ms(statistics.median(stmt))} | {ms(min(stmt))} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after, "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
