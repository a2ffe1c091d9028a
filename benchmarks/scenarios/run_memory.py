"""Scenario ``memory-run``: many processes per node, each holding the blog pipeline after reading every weight.

    python benchmarks/run.py memory-run --scale full -n 3

Two modes, alternated, each repetition in its own runtime directory with a warm cache (a first, uncounted
process published the entries):

* ``python, warm cache``: ``procs`` fresh ``python blog.py --touch --hold`` processes with ``overmind.activate()``;
* ``overmind run, warm``: ``procs`` ``overmind run blog.py --touch --hold`` children of one template (a first,
  uncounted ``overmind run`` started it, and the template built the pipeline's objects ahead).

While all of them hold the pipeline, PSS (``/proc/PID/smaps_rollup``) is summed over the holders, the server
and, for ``overmind run``, the template with its spare child. The target of a node with ``procs`` processes: one
copy of the weights + one template + 0.1 GiB per process. Plain processes are not run: each holds its own copy
of the weights, ``procs`` copies in all (eight copies of the full fixture do not fit this machine's memory).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "harness"))

import harness  # noqa: E402
import report  # noqa: E402

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")
MODES = ("python, warm cache", "overmind run, warm")
PROCS = 8
PER_PROCESS_TARGET = 0.1 * 2**30


def _template_pids(runtime_dir: str) -> list[int]:
    pids = []
    for path in glob.glob(os.path.join(runtime_dir, "templates", "*.json")):
        try:
            with open(path) as f:
                pids.append(int(json.load(f)["pid"]))
        except (OSError, ValueError, KeyError):
            continue
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def _template_processes(runtime_dir: str, reports: list[dict]) -> list[int]:
    """The templates and their children other than the holders (the spare each keeps for the next run)."""
    holders = {r["pid"] for r in reports}
    found = []
    for pid in _template_pids(runtime_dir):
        found.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                found += [int(c) for c in f.read().split() if int(c) not in holders]
        except OSError:
            continue
    return found


def _start(h: harness.Harness, mode: str, argv: list[str], label: str, rt: str) -> tuple[subprocess.Popen, dict]:
    """One holder; for ``overmind run`` the report's pid is the forked child's, not the launcher's."""
    script = os.path.join(HERE, "blog.py")
    if mode == MODES[0]:
        return h.start_holder(script, argv, "overmind", label, runtime_dir=rt)
    log = h._log_path(label)
    with open(log, "w") as err:
        proc = subprocess.Popen([OVERMIND, "run", script, *argv], stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.PIPE, text=True,
                                env=h._env("overmind", rt, {"BENCH_T0": repr(time.time())}))
    for line in proc.stdout:
        if line.startswith(harness.RESULT_MARK):
            return proc, {**json.loads(line[len(harness.RESULT_MARK):]), "label": label}
    proc.wait()
    raise harness.ChildFailed(f"{label}: overmind run exited {proc.returncode} without a report; stderr "
                              f"({log}):\n{harness._tail(log)}")


def _warm(h: harness.Harness, argv: list[str], rt: str, tag: str) -> None:
    """Publish the entries (a python process), then start the template and let it build the objects ahead."""
    script = os.path.join(HERE, "blog.py")
    h.run_child(script, argv, "overmind", f"{tag}-publish", runtime_dir=rt, env=harness.ADMIT_FIRST)
    subprocess.run([OVERMIND, "run", script, *argv], env=h._env("overmind", rt, {"BENCH_T0": repr(time.time())}),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=True,
                   timeout=h.timeout)
    deadline = time.monotonic() + 120
    log = os.path.join(rt, "templates", "templates.log")
    while time.monotonic() < deadline:  # the template builds after a quiet second; give it the time it needs
        with open(log) as f:
            if f.read().count("objects built ahead: built ") >= 3:
                break
        time.sleep(0.5)


def measure(h: harness.Harness, paths: dict, n: int, procs: int = PROCS) -> tuple[str, dict]:
    """``n`` repetitions of each mode with ``procs`` holders; returns (markdown, samples)."""
    argv = [paths["sd15-fp16"], paths["controlnet-depth"], paths["controlnet-edge"], "--touch", "--hold"]
    groups: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(n):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            tag = f"memory-run-{MODES.index(mode)}-{i}"
            with h.runtime() as rt:
                held, reports = [], []
                try:
                    _warm(h, argv[:3], rt, tag)
                    for k in range(procs):
                        proc, rep = _start(h, mode, argv, f"{tag}-{k}", rt)
                        held.append(proc)
                        reports.append(rep)
                    time.sleep(1.0)  # let the last process settle (allocator trims, lazy frees)
                    holders = [harness.smaps_rollup(r["pid"]) for r in reports]
                    server = [harness.smaps_rollup(pid) for pid in harness.server_pids(rt)]
                    template = ([harness.smaps_rollup(pid) for pid in _template_processes(rt, reports)]
                                if mode == MODES[1] else [])
                finally:
                    for p in held:
                        harness.release(p)
                    subprocess.run([OVERMIND, "stop"], env={**os.environ, "OVERMIND_RUNTIME_DIR": rt},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
            weights = reports[0]["weight_bytes"]
            total = sum(r["Pss"] for r in holders + server + template)
            template_pss = sum(r["Pss"] for r in template)
            sample = {"pss_sum": total, "pss_holders": sum(r["Pss"] for r in holders),
                      "pss_server": sum(r["Pss"] for r in server), "pss_template": template_pss,
                      "weights": weights, "per_process_over_one_copy": (total - weights - template_pss) / procs,
                      "target": weights + template_pss + procs * PER_PROCESS_TARGET,
                      "per_process": [r["Pss"] for r in holders], "reports": reports, "mode_name": mode}
            groups[mode].append(sample)
            print(f"  memory-run rep {i + 1}/{n} {mode}: PSS {total / 2**30:.2f} GiB (weights "
                  f"{weights / 2**30:.2f} GiB, template {template_pss / 2**30:.2f} GiB)", file=sys.stderr, flush=True)
    measures = [("pss_sum", f"sum of PSS, {procs} processes + server (+ template)", "GiB"),
                ("pss_holders", f"the {procs} processes", "GiB"), ("pss_server", "server", "GiB"),
                ("pss_template", "template", "GiB"), ("weights", "one copy of the weights", "GiB"),
                ("per_process_over_one_copy", "(sum - one copy - template) / processes", "GiB"),
                ("target", f"target: one copy + template + 0.1 GiB x {procs}", "GiB")]
    ratios = [("sum of PSS: python warm cache / overmind run",
               report.pair_ratios(groups[MODES[0]], groups[MODES[1]], "pss_sum"))]
    return report.table(groups, measures) + "\n\n" + report.ratio_table(ratios), groups
