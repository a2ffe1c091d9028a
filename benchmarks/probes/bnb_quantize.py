"""What the cache saves on a bitsandbytes load: quantize-on-load vs. a cache hit, on this machine's CPU.

Usage (repository root, dev venv)::

    python benchmarks/probes/bnb_quantize.py [--sizes tiny,100m] [--mode 4bit|8bit] [--repeat 3]

For each model size it saves a Llama with random weights (fp32 safetensors) in a temporary folder and times,
each in a fresh process against a private Overmind server (so imports are excluded; file pages are warm):

- ``plain fp32``: ``from_pretrained(path)``, no quantization (for scale);
- ``plain quantized``: ``from_pretrained(path, quantization_config=..., device_map="cpu")``;
- ``overmind miss``: the same through ``overmind.load`` on an empty cache (quantize + pickle + write + publish);
- ``overmind hit``: the same in a later process (map + unpickle, no quantization).

Imports, adapter discovery and the server connection are done before the clock starts in every case.

Prints a Markdown table of seconds (median of ``--repeat`` runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {  # name -> LlamaConfig overrides
    "tiny": dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "100m": dict(vocab_size=16000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12),
}
CONFIGS = {
    "4bit": "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, "
            "bnb_4bit_compute_dtype=torch.float32)",
    "8bit": "BitsAndBytesConfig(load_in_8bit=True)",
}

TIMED = '''
import json, os, sys, time, torch
import overmind
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
path, case = sys.argv[1], sys.argv[2]
qc = {config}
# Imports happen once per process whether or not the cache is used: do them before the clock starts (the
# libraries transformers imports lazily, the adapters and what their hooks import, the server connection).
import accelerate, bitsandbytes, transformers.integrations.bitsandbytes, transformers.quantizers.auto
from transformers.models.llama import modeling_llama
from overmind.client import connection
from overmind.adapters import hooks
from overmind.keys import key
hooks.key_parts(key.describe_loader(AutoModelForCausalLM.from_pretrained),
                  arguments={{"pretrained_model_name_or_path": path, "quantization_config": qc}})
connection.get_client().status()
t = time.perf_counter()
if case == "plain fp32":
    m = AutoModelForCausalLM.from_pretrained(path)
elif case == "plain quantized":
    m = AutoModelForCausalLM.from_pretrained(path, quantization_config=qc, device_map="cpu")
else:
    m = overmind.load(AutoModelForCausalLM.from_pretrained, path, quantization_config=qc, device_map="cpu")
print("BENCH:" + json.dumps(time.perf_counter() - t))
'''


def build(folder: Path, size: str) -> tuple[Path, int]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=128, tie_word_embeddings=False, **SIZES[size]))
    model.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def timed(script: str, path: Path, case: str, env: dict[str, str]) -> float:
    proc = subprocess.run([sys.executable, "-c", script, str(path), case], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=1800)
    lines = [ln[6:] for ln in proc.stdout.splitlines() if ln.startswith("BENCH:")]
    if proc.returncode or not lines:
        raise SystemExit(f"{case} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="tiny,100m")
    ap.add_argument("--mode", default="4bit", choices=sorted(CONFIGS))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from overmind.testing import isolated_runtime

    script = TIMED.format(config=CONFIGS[args.mode])
    rows = []
    with tempfile.TemporaryDirectory(prefix="overmind-bnb-bench-") as tmp:
        for size in args.sizes.split(","):
            path, n_params = build(Path(tmp) / size, size)
            times: dict[str, list[float]] = {}
            for _ in range(args.repeat):
                with isolated_runtime() as runtime:  # an empty cache per round: the miss is a real miss
                    env = {"OVERMIND_RUNTIME_DIR": runtime, "OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1"}
                    for case in ("plain fp32", "plain quantized", "overmind miss", "overmind hit"):
                        times.setdefault(case, []).append(timed(script, path, case, env))
            rows.append((size, n_params, {k: statistics.median(v) for k, v in times.items()}))
    cases = ("plain fp32", "plain quantized", "overmind miss", "overmind hit")
    print(f"\n{args.mode}, median of {args.repeat}, seconds (the load call only: fresh process, imports done, warm page cache)\n")
    print("| model | params | " + " | ".join(cases) + " | quantized / hit |")
    print("|---|---:|" + "---:|" * (len(cases) + 1))
    for size, n, t in rows:
        speedup = t["plain quantized"] / t["overmind hit"]
        print(f"| {size} | {n / 1e6:.1f} M | " + " | ".join(f"{t[c]:.3f}" for c in cases) + f" | {speedup:.1f}x |")


if __name__ == "__main__":
    main()
