"""Overmind at another commit against this working tree: the blog's four calls in fresh processes, interleaved.

    python benchmarks/probes/ab_trees.py REV [--ckpt fp16|fp32] [--mode first|cold|warm] [-n N] [--scale full|small]

A is a ``git worktree`` of ``REV`` and B one of this working tree's state (its commit, or ``git stash create`` of its
tracked changes), both made under /tmp and removed after, set up alike: each side's ``packages/*/src`` come first on
``PYTHONPATH``, so its Overmind (client and server) runs with this venv's libraries, and the compiled
``overmind.native._C`` of this tree is copied into both (the extension's ABI is the venv's), so that nothing but the
commit differs: a side without the extension runs the pure-Python twins, ~20% slower warm. The processes run
``benchmarks/scenarios/blog.py --activate-first`` (the blog's order) in pairs whose order alternates (A B, B A, ...),
so a drift of the machine, and whatever one process leaves the next, lands on both. ``first`` and ``cold``: every
process gets a fresh runtime directory (its own server); ``first`` loads with the default admission (by reuse: the
server's first load of a key publishes nothing), ``cold`` with ``OVERMIND_ADMIT=first``, so each one publishes (a
commit older than admission by reuse publishes in both); ``warm``: each tree has one runtime, filled by an untimed
first process that publishes. Without the per-step breakdown (its hooks name this tree's internals). Prints a markdown table and saves it under
``benchmarks/results/ab-*.md``. It answers "did this change make the load faster", which ratios against plain
taken minutes apart cannot when the machine drifts.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
sys.path.insert(0, os.path.join(BENCHMARKS, "harness"))
import harness  # noqa: E402
from harness import Harness, machine  # noqa: E402
from report import machine_line, ratio_table, summary  # noqa: E402

SCRIPT = os.path.join(BENCHMARKS, "scenarios", "blog.py")


def _worktree(rev: str) -> str:
    path = tempfile.mkdtemp(prefix="om-ab-", dir="/tmp")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", path, rev], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for so in glob.glob(os.path.join(ROOT, "packages/overmind-core/src/overmind/native/_C*.so")):
        shutil.copy2(so, os.path.join(path, "packages/overmind-core/src/overmind/native/"))
    return path


def _this_tree() -> str:
    """A commit of this working tree's tracked files as they are: HEAD, or a stash commit of its changes."""
    stash = subprocess.run(["git", "-C", ROOT, "stash", "create"], text=True, capture_output=True,
                           check=True).stdout.strip()
    return stash or subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], text=True, capture_output=True,
                                   check=True).stdout.strip()


def _remove_worktree(path: str) -> None:
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    shutil.rmtree(path, ignore_errors=True)


def _pythonpath(tree: str) -> str:
    srcs = sorted(glob.glob(os.path.join(tree, "packages", "*", "src")))
    return os.pathsep.join(srcs + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the commit to compare this working tree against (A)")
    ap.add_argument("--ckpt", choices=["fp16", "fp32"], default="fp16")
    ap.add_argument("--mode", choices=["first", "cold", "warm"], default="cold")
    ap.add_argument("-n", type=int, default=5, help="pairs")
    ap.add_argument("--scale", choices=["small", "full"], default="full")
    args = ap.parse_args()

    fixtures = os.path.join(BENCHMARKS, "fixtures", args.scale)
    argv = [os.path.join(fixtures, f"sd15-{args.ckpt}"), os.path.join(fixtures, "controlnet-depth"),
            os.path.join(fixtures, "controlnet-edge"), "--activate-first"]
    if not os.path.isdir(argv[0]):
        sys.exit(f"ab_trees.py: no fixture at {argv[0]}; run: python benchmarks/fixtures/make_fixture.py "
                 f"--scale {args.scale}")
    results = os.path.join(BENCHMARKS, "results")
    h = Harness(results)
    facts = machine()
    trees = {"A": _worktree(args.rev), "B": _worktree(_this_tree())}
    admit = {} if args.mode == "first" else dict(harness.ADMIT_FIRST)  # the fill and every cold process publish
    envs = {side: {"PYTHONPATH": _pythonpath(tree), "BENCH_BREAKDOWN": "0", **admit} for side, tree in trees.items()}
    samples: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for side, root in trees.items():  # each side imports its own tree's Overmind
            where = subprocess.run([sys.executable, "-c", "import overmind; print(overmind.__file__)"], text=True,
                                   env={**os.environ, **envs[side]}, capture_output=True, check=True).stdout.strip()
            if not where.startswith(os.path.join(root, "packages")):
                sys.exit(f"ab_trees.py: side {side} imports {where}, not its tree's ({root}): an installed copy "
                         f"shadows it")
        with contextlib.ExitStack() as stack:
            warm_rt = {}
            if args.mode == "warm":
                for side in "AB":
                    warm_rt[side] = stack.enter_context(h.runtime())
                    h.run_child(SCRIPT, argv, "overmind", f"ab-{side}-fill", warm_rt[side], envs[side])
            for i in range(args.n):
                for side in ("AB" if i % 2 == 0 else "BA"):
                    with contextlib.ExitStack() as one:
                        rt = warm_rt.get(side) or one.enter_context(h.runtime())
                        r = h.run_child(SCRIPT, argv, "overmind", f"ab-{side}-{args.mode}{i}", rt, envs[side])
                    samples[side].append(r["times"]["from_pretrained"])
                    print(f"  {side} {args.mode} {i + 1}/{args.n}: {samples[side][-1]:.3f} s", file=sys.stderr)
    finally:
        for tree in trees.values():
            _remove_worktree(tree)

    command = f"python benchmarks/probes/ab_trees.py {args.rev} --ckpt {args.ckpt} --mode {args.mode} -n {args.n}"
    lines = [f"### {args.rev} (A) against the working tree (B): {args.mode} blog, {args.ckpt} ({args.scale})", "",
             f"`{command}`", "", f"| the 4 calls, {args.mode} (s) | n | min | median | max |",
             "|---|---:|---:|---:|---:|"]
    for side, label in (("A", f"A ({args.rev})"), ("B", f"B (tree {facts.get('commit', '-')})")):
        n, lo, med, hi = summary(samples[side])
        lines.append(f"| {label} | {n} | {lo:.3f} | {med:.3f} | {hi:.3f} |")
    lines += ["", ratio_table([("B / A", [b / a for a, b in zip(samples["A"], samples["B"])])]), "",
              machine_line(facts)]
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(results, f"ab-{args.mode}-{args.ckpt}-{time.strftime('%Y%m%d-%H%M%S')}.md")
    with open(out, "w") as f:
        f.write(text)
    print(f"saved {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
