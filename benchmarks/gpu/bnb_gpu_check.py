"""On a CUDA machine: a model quantized on cuda:0 in one process comes back on cuda:0 in another.

Usage (from the repository root, in the dev venv, on a machine with an NVIDIA GPU)::

    python benchmarks/gpu/bnb_gpu_check.py [--model FOLDER] [--device cuda:0]

Needs torch with CUDA, bitsandbytes with its CUDA library, transformers, accelerate, overmind-core and
overmind-bnb. Without ``--model`` it builds a tiny Llama (hidden 64) in a temporary folder. It runs against a
private Overmind server (its own runtime directory, stopped at the end) and prints one line per check; the
exit status is 0 when every check passes, 1 when one fails, 2 when the machine cannot run the check.

For each of 4-bit (nf4, double quantization) and 8-bit, loaded with ``device_map={"": <device>}``:

1. a first fresh process loads through ``overmind.load`` (a miss: bitsandbytes quantizes on the GPU) and,
   for reference, once with the plain loader;
2. a second fresh process loads through ``overmind.load`` (a hit) and must: run no quantization; hold every
   ``Params4bit`` / ``Int8Params`` and every quantization statistic (absmax, quant map, nested absmax, SCB) on
   the same device; produce logits and greedy tokens identical to the first process's fresh model; refuse
   ``.to(torch.float16)`` with the same error.

Then the server: ``status`` says it never imported torch, and its memory map holds no CUDA library.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

MARK = "GPU-CHECK-RESULT:"

CONFIGS = {
    "4bit": "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, "
            "bnb_4bit_compute_dtype=torch.float16)",
    "8bit": "BitsAndBytesConfig(load_in_8bit=True)",
}

# Runs in each fresh process. QUANTIZE_CALLS counts bitsandbytes' weight quantizations (8-bit matmuls also
# call int8_vectorwise_quant on their inputs, so counts are read right after the load, before any forward).
PRELUDE = textwrap.dedent('''
    import json, os, torch
    import bitsandbytes.functional as bf
    QUANTIZE_CALLS = {"4bit": 0, "8bit": 0}
    def counting(name, fn):
        def wrapper(*a, **k):
            QUANTIZE_CALLS[name] += 1
            return fn(*a, **k)
        return wrapper
    bf.quantize_4bit = counting("4bit", bf.quantize_4bit)
    bf.int8_vectorwise_quant = counting("8bit", bf.int8_vectorwise_quant)

    import overmind
    from bitsandbytes.nn import Int8Params, Params4bit
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    MODEL, DEVICE = os.environ["GPU_CHECK_MODEL"], os.environ["GPU_CHECK_DEVICE"]
    IDS = [[1, 7, 12, 5, 9, 30, 4]]

    def report(value):
        print("GPU-CHECK-RESULT:" + json.dumps(value), flush=True)

    def quantized_tensors(model):
        for name, p in model.named_parameters():
            if isinstance(p, Params4bit):
                qs = p.quant_state
                yield name, p
                yield name + ".absmax", qs.absmax
                yield name + ".quant_map", qs.code
                if qs.nested:
                    yield name + ".nested_absmax", qs.state2.absmax
                    yield name + ".nested_quant_map", qs.state2.code
            elif isinstance(p, Int8Params):
                yield name, p
                if p.SCB is not None:
                    yield name + ".SCB", p.SCB

    def observe(model):
        tensors = list(quantized_tensors(model))
        out = {"n_quantized": len(tensors),
               "devices": sorted({str(t.device) for _, t in tensors}),
               "types": sorted({type(p).__name__ for p in model.parameters()})}
        try:
            model.to(torch.float16)
            out["to_fp16"] = "ok"
        except Exception as e:
            out["to_fp16"] = [type(e).__name__, str(e)]
        ids = torch.tensor(IDS, device=DEVICE)
        with torch.no_grad():
            out["logits"] = model(ids).logits.float().cpu().tolist()
        out["tokens"] = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False).cpu().tolist()
        return out
''')

FIRST = textwrap.dedent('''
    kwargs = dict(quantization_config={config}, device_map={{"": DEVICE}})
    reference = observe(AutoModelForCausalLM.from_pretrained(MODEL, **kwargs))
    before = dict(QUANTIZE_CALLS)
    model = overmind.load(AutoModelForCausalLM.from_pretrained, MODEL, **kwargs)
    quantized = {{k: QUANTIZE_CALLS[k] - before[k] for k in QUANTIZE_CALLS}}
    report({{"reference": reference, "cached": observe(model), "quantized": quantized}})
''')

SECOND = textwrap.dedent('''
    kwargs = dict(quantization_config={config}, device_map={{"": DEVICE}})
    model = overmind.load(AutoModelForCausalLM.from_pretrained, MODEL, **kwargs)
    quantized = dict(QUANTIZE_CALLS)
    report({{**observe(model), "quantized": quantized}})
''')


class Checks:
    """Collects pass/fail lines."""

    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {what}" + (f"  ({detail})" if detail and not ok else ""), flush=True)
        self.failed += not ok


def run(script: str, env: dict[str, str]) -> dict:
    """Run ``script`` in a fresh interpreter and return what it reported; exit on a crash, with its output."""
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=900)
    lines = [ln[len(MARK):] for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        print(f"FAIL  a check process exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        sys.exit(1)
    return json.loads(lines[-1])


def build_model(folder: Path) -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, do_sample=False)
    model.save_pretrained(folder)
    return folder


def check_mode(checks: Checks, mode: str, env: dict[str, str], device: str) -> None:
    first = run(PRELUDE + FIRST.format(config=CONFIGS[mode]), env)
    second = run(PRELUDE + SECOND.format(config=CONFIGS[mode]), env)
    ref, cached = first["reference"], first["cached"]
    kind = mode
    checks.check(first["quantized"][kind] > 0, f"{mode}: the first process quantized on {device}",
                 str(first["quantized"]))
    checks.check(second["quantized"] == {"4bit": 0, "8bit": 0}, f"{mode}: the second process quantized nothing",
                 str(second["quantized"]))
    checks.check(ref["devices"] == [device], f"{mode}: the fresh model's quantized tensors are on {device}",
                 str(ref["devices"]))
    for name, got in (("first process, cached", cached), ("second process", second)):
        checks.check(got["devices"] == [device] and got["n_quantized"] == ref["n_quantized"],
                     f"{mode}: {name}: all {ref['n_quantized']} quantized tensors on {device}",
                     f"{got['devices']}, {got['n_quantized']}")
        checks.check(got["types"] == ref["types"], f"{mode}: {name}: parameter types", str(got["types"]))
        diff = max((abs(a - b) for ra, rb in zip(got["logits"][0], ref["logits"][0]) for a, b in zip(ra, rb)),
                   default=0.0)
        checks.check(got["logits"] == ref["logits"], f"{mode}: {name}: logits identical to a fresh load",
                     f"max abs diff {diff}")
        checks.check(got["tokens"] == ref["tokens"], f"{mode}: {name}: greedy tokens identical",
                     f"{got['tokens']} vs {ref['tokens']}")
        checks.check(got["to_fp16"] == ref["to_fp16"], f"{mode}: {name}: .to(torch.float16) refused alike",
                     f"{got['to_fp16']} vs {ref['to_fp16']}")


def check_server(checks: Checks) -> None:
    from overmind.client.connection import get_client

    status = get_client().status()
    checks.check(status.get("torch_imported") is False, "server: never imported torch", str(status))
    pid = status.get("pid")
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError as e:
        checks.check(False, "server: memory map readable", str(e))
        return
    cuda_libs = sorted({ln.split()[-1] for ln in maps.splitlines()
                        if any(s in ln for s in ("libcuda", "libcudart", "libtorch_cuda", "libnvrtc"))})
    checks.check(not cuda_libs, "server: no CUDA library mapped", ", ".join(cuda_libs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a causal LM folder (default: build a tiny Llama)")
    parser.add_argument("--device", default="cuda:0", help="cuda:N; 'cpu' dry-runs the script's logic")
    parser.add_argument("--modes", default="4bit,8bit")
    args = parser.parse_args()

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("SKIP  no CUDA device visible to torch; run this on a GPU machine")
        return 2
    from overmind.testing import isolated_runtime

    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="overmind-bnb-gpu-") as tmp, isolated_runtime():
        model = args.model or str(build_model(Path(tmp) / "tiny-llama"))
        env = {"GPU_CHECK_MODEL": model, "GPU_CHECK_DEVICE": args.device, "OVERMIND_STRICT": "1",
               "HF_HUB_OFFLINE": "1"}
        for mode in args.modes.split(","):
            check_mode(checks, mode, env, args.device)
        check_server(checks)
    print(f"{'OK' if not checks.failed else 'FAILED'}: {checks.failed} check(s) failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
