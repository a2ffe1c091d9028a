"""Scenario ``run``: the blog script and the MiniLM script end to end with ``python`` and with ``overmind run``.

    python benchmarks/run.py run --scale full -n 5

Three modes, each a fresh process, alternated (the order rotates every repetition), all against one runtime
directory whose cache is warm (a first, uncounted process published the entries: ``OVERMIND_ADMIT=first``):

* ``python, no Overmind``: ``python blog.py ...`` with ``BENCH_MODE=plain`` (what a user has today);
* ``python, warm cache``: ``python blog.py ...`` with ``overmind.activate()`` and the cache warm;
* ``overmind run, warm``: ``overmind run blog.py ...``, the same script, cache and template warm (a first,
  uncounted ``overmind run`` started the template).

Measured from outside: ``ready`` is the wall time from just before the spawn to the script's report
(``spawn_to_emit_s``: process start to pipeline ready), ``process`` from just before the spawn to its exit.
Ratios are pair by pair. The MiniLM script adds ``sentence_transformers`` to the default preload list
(``OVERMIND_PRELOAD=+sentence_transformers``), as a user of it would.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "harness"))

import harness  # noqa: E402
import report  # noqa: E402

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")
MODES = ("python, no Overmind", "python, warm cache", "overmind run, warm")
MEASURES = [("ready_s", "process start to ready (report)", "s"), ("process_s", "process start to exit", "s"),
            ("times.import", "imports inside the script", "s"), ("load_s", "the loads inside the script", "s")]


def spawn(h: harness.Harness, mode: str, script: str, argv: list[str], label: str, runtime_dir: str,
          env: dict) -> dict:
    """One fresh process of ``mode``; its report plus ``ready_s`` and ``process_s``."""
    bench_mode = "plain" if mode == MODES[0] else "overmind"
    command = ([OVERMIND, "run"] if mode == MODES[2] else [sys.executable]) + [script, *argv]
    log = h._log_path(label)
    with open(log, "w") as err:
        t_spawn = time.time()
        t0 = time.perf_counter()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, stdin=subprocess.DEVNULL,
                              env=h._env(bench_mode, runtime_dir, {"BENCH_T0": repr(t_spawn), **env}),
                              timeout=h.timeout)
        process_s = time.perf_counter() - t0
    sample = harness._parse(proc.stdout)
    if proc.returncode != 0 or sample is None:
        raise harness.ChildFailed(f"{label}: {command} exited {proc.returncode}; stderr ({log}):\n{harness._tail(log)}")
    with open(log) as f:
        warned = [line for line in f if line.startswith("overmind run:")]
    if warned:
        raise harness.ChildFailed(f"{label}: overmind run fell back to plain python: {warned[0]}")
    sample.update(process_s=process_s, ready_s=sample["spawn_to_emit_s"], label=label, mode_name=mode,
                  load_s=sample["times"].get("from_pretrained", sample["times"].get("load")))
    return sample


def one_script(h, tag: str, script: str, argv: list[str], n: int, env: dict) -> tuple[str, dict]:
    groups: dict[str, list[dict]] = {m: [] for m in MODES}
    with h.runtime() as rt:
        try:
            spawn(h, MODES[1], script, argv, f"{tag}-publish", rt, {**env, **harness.ADMIT_FIRST})  # warms the cache
            spawn(h, MODES[2], script, argv, f"{tag}-template", rt, env)  # starts the template
            for i in range(n):
                order = MODES[i % 3:] + MODES[:i % 3]
                for mode in order:
                    sample = spawn(h, mode, script, argv, f"{tag}-{MODES.index(mode)}-{i}", rt, env)
                    groups[mode].append(sample)
                    print(f"  {tag} rep {i + 1}/{n} {mode}: ready {sample['ready_s']:.2f} s, exit "
                          f"{sample['process_s']:.2f} s", file=sys.stderr, flush=True)
        finally:
            subprocess.run([OVERMIND, "stop"], env={**os.environ, "OVERMIND_RUNTIME_DIR": rt},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    run, warm, plain = groups[MODES[2]], groups[MODES[1]], groups[MODES[0]]
    ratios = [(f"{tag}: ready, python no Overmind / overmind run", report.pair_ratios(plain, run, "ready_s")),
              (f"{tag}: ready, python warm cache / overmind run", report.pair_ratios(warm, run, "ready_s")),
              (f"{tag}: exit, python no Overmind / overmind run", report.pair_ratios(plain, run, "process_s")),
              (f"{tag}: exit, python warm cache / overmind run", report.pair_ratios(warm, run, "process_s"))]
    text = f"{tag}\n\n" + report.table(groups, MEASURES) + "\n\n" + report.ratio_table(ratios)
    return text, groups


LAUNCH_MODES = ("python -c pass", "overmind run -c pass")
LAUNCH_REPS = 10  # per repetition of the scenario: a launch is short, its spread is the host's


def launcher(h: harness.Harness, n: int) -> tuple[str, dict]:
    """``overmind run -c pass`` against ``python -c pass``, alternated, ``n`` x LAUNCH_REPS pairs, template
    warm: what the launcher and the child's set-up cost before a program's first line and after its last."""
    groups: dict[str, list[dict]] = {m: [] for m in LAUNCH_MODES}
    commands = {LAUNCH_MODES[0]: [sys.executable, "-c", "pass"], LAUNCH_MODES[1]: [OVERMIND, "run", "-c", "pass"]}
    with h.runtime() as rt:
        env = h._env("overmind", rt, {})
        try:
            subprocess.run(commands[LAUNCH_MODES[1]], env=env, check=True, timeout=h.timeout)  # starts the template
            for i in range(n * LAUNCH_REPS):
                for mode in (LAUNCH_MODES if i % 2 == 0 else LAUNCH_MODES[::-1]):
                    t0 = time.perf_counter()
                    out = subprocess.run(commands[mode], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                         text=True, timeout=h.timeout)
                    wall = time.perf_counter() - t0
                    if out.returncode != 0 or out.stderr:
                        raise harness.ChildFailed(f"{commands[mode]} exited {out.returncode}: {out.stderr[-2000:]}")
                    groups[mode].append({"process_s": wall, "mode_name": mode})
        finally:
            subprocess.run([OVERMIND, "stop"], env={**os.environ, "OVERMIND_RUNTIME_DIR": rt},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    print(f"  launcher: {n * LAUNCH_REPS} pairs", file=sys.stderr, flush=True)
    ratios = [("launch: overmind run -c pass / python -c pass",
               report.pair_ratios(groups[LAUNCH_MODES[1]], groups[LAUNCH_MODES[0]], "process_s"))]
    measures = [("process_s", "process start to exit", "s")]
    return "launcher\n\n" + report.table(groups, measures) + "\n\n" + report.ratio_table(ratios), groups


def scenario(h: harness.Harness, paths: dict, n: int) -> tuple[str, dict]:
    """The blog (fp16 checkpoint) and MiniLM, ``n`` repetitions each, and the launcher alone; returns (markdown,
    samples)."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    blog_argv = [paths["sd15-fp16"], paths["controlnet-depth"], paths["controlnet-edge"]]
    blog_text, blog = one_script(h, "blog fp16", os.path.join(HERE, "blog.py"), blog_argv, n, {})
    minilm_text, minilm = one_script(h, "MiniLM", os.path.join(HERE, "minilm.py"), [], n,
                                     {"OVERMIND_PRELOAD": "+sentence_transformers"})
    launch_text, launch = launcher(h, n)
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = f"{blog_text}\n\n{minilm_text}\n\n{launch_text}\n\n`uptime` before: {uptime}; after: {after}"
    return text, {"blog": blog, "minilm": minilm, "launcher": launch, "uptime": [uptime, after]}
