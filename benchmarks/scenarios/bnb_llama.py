"""Scenario 6: a Llama-architecture model (~1.1B parameters at full scale) loaded 4-bit with bitsandbytes,
which quantizes every linear weight on load (on the CPU here).

    python benchmarks/scenarios/bnb_llama.py LLAMA_DIR
"""
import time

_t_process = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "harness")))  # child.py
import child  # noqa: E402

path = sys.argv[1]
sw = child.Stopwatch()
with sw("import"):
    # bitsandbytes imported here, in both modes: otherwise plain pays its import inside from_pretrained and
    # Overmind inside activate() (the adapter imports it), and the load times would not compare.
    import bitsandbytes  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
with sw("overmind_setup"):
    facts = child.start(wrap={"transformers:AutoModelForCausalLM": "from_pretrained"})

quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16)
with sw("load"):
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.float16, device_map="cpu")
child.ready()
kinds = sorted({type(p).__name__ for p in model.parameters()})
with sw("forward"):
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
child.emit(**facts, times=sw.times, parameter_types=kinds, weight_bytes=child.weight_bytes(model),
           finite=bool(torch.isfinite(logits).all()), python_s=time.perf_counter() - _t_process)
