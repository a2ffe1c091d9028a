"""Helpers for the overmind-bnb tests: a bitsandbytes-friendly tiny Llama, configs, pickling round
trips (importable by this name: the package's ``tests/`` folder is on pytest's ``pythonpath``).

Why not ``tiny_models.build_llama``: its hidden size is 32, and bitsandbytes 0.50's CPU 4-bit kernel
(used on CPUs with AVX512-BF16, as here, under ``torch.no_grad``) repacks weights in blocks of 64
input features and 32 output features; a 32-wide layer fails there with ``shape '[32, 0]' is
invalid``. This model is 64 wide.
"""
from __future__ import annotations

import io
import pickle
import textwrap
from pathlib import Path
from typing import Any

import torch

from overmind.testing import run_fresh

PROMPT_IDS = [[1, 7, 12, 5, 9, 30, 4]]

# Code for fresh processes: count every quantization bitsandbytes performs (4-bit and 8-bit), in
# any path (transformers' quantizers and bare Linear4bit/Linear8bitLt both end in these two
# functions).
COUNT_QUANTIZATION = """
import bitsandbytes.functional as _bf
QUANTIZE_CALLS = {"4bit": 0, "8bit": 0}
def _counting(name, fn):
    def wrapper(*a, **k):
        QUANTIZE_CALLS[name] += 1
        return fn(*a, **k)
    return wrapper
_bf.quantize_4bit = _counting("4bit", _bf.quantize_4bit)
_bf.int8_vectorwise_quant = _counting("8bit", _bf.int8_vectorwise_quant)
"""


def build_bnb_llama(folder: str | Path, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """Save a tiny ``LlamaForCausalLM`` (2 layers, hidden 64, GQA) whose linear layers suit bnb's
    CPU kernels."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # large weights: greedy decoding does not collapse onto one token
            for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3,
                                               do_sample=False)
    model.save_pretrained(folder)
    return Path(folder)


def config_4bit(**overrides: Any):
    from transformers import BitsAndBytesConfig

    kw = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
              bnb_4bit_compute_dtype=torch.float32)
    kw.update(overrides)
    return BitsAndBytesConfig(**kw)


def config_8bit(**overrides: Any):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_8bit=True, **overrides)


class Roundtrip:
    """An object pickled as an entry is, by Overmind's own pickler, and rebuilt from a sealed memfd as a hit
    rebuilds it (``overmind.testing.roundtrip``).

    ``obj`` is the rebuilt object; :meth:`in_buffer` tells whether a tensor's bytes lie in the entry's mapping
    (zero-copy).
    """

    def __init__(self, obj: Any, reducers: dict | None = None):
        from overmind.testing import roundtrip
        from overmind_bnb.reducers import reducer_table

        self.obj = roundtrip(obj, reducers if reducers is not None else reducer_table())

    def in_buffer(self, tensor: torch.Tensor) -> bool:
        from overmind.testing import overmind_mapped

        return overmind_mapped(tensor.data_ptr()) and overmind_mapped(tensor.data_ptr() + tensor.nbytes - 1)


def plain_roundtrip(obj: Any) -> Any:
    """Round trip through the standard library's pickle with the adapter's reducers (no Overmind
    pickler)."""
    from overmind_bnb.reducers import reducer_table

    table = reducer_table()

    class P(pickle.Pickler):
        def reducer_override(self, o: Any) -> Any:
            for base in type(o).__mro__:
                if base in table:
                    return table[base](o)
            return NotImplemented

    buf = io.BytesIO()
    P(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return pickle.loads(buf.getvalue())


# --- fresh-process scripts shared by test_cross_process and test_activate -----------------

CONFIGS = {
    "4bit-nf4-double": "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                       "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)",
    "4bit-fp4": "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='fp4')",
    "8bit": "BitsAndBytesConfig(load_in_8bit=True)",
}

# Shared by every script: what a process observes about a model, as JSON.
PRELUDE = COUNT_QUANTIZATION + textwrap.dedent('''
    import os, torch
    import overmind
    from overmind.testing import report, overmind_mapped
    from bitsandbytes.nn import Int8Params, Params4bit
    from transformers import AutoModel, AutoModelForCausalLM, BitsAndBytesConfig

    def outcome(call):
        try:
            call()
        except Exception as e:
            return [type(e).__name__, str(e)]
        return "ok"

    def quantized_tensors(model):
        """Each bitsandbytes parameter's packed weight and its statistics."""
        for p in model.parameters():
            if isinstance(p, Params4bit):
                qs = p.quant_state
                yield from (p, qs.absmax, qs.code) + ((qs.state2.absmax,) if qs.nested else ())
            elif isinstance(p, Int8Params):
                yield from (p, p.SCB)

    def mapped(model):
        """How many quantized tensors lie in an Overmind memfd mapping, out of how many (before
        any forward)."""
        ts = list(quantized_tensors(model))
        return [sum(overmind_mapped(t.data_ptr()) for t in ts), len(ts)]

    def observe(model, ids, generate=True):
        params = [p for p in model.parameters() if p.device.type != "meta"]
        out = {"mapped": mapped(model),
               "types": sorted({type(p).__name__ for p in model.parameters()}),
               "all_mapped": [sum(overmind_mapped(p.data_ptr()) for p in params), len(params)]}
        if hasattr(model, "hf_quantizer"):  # transformers' refusals of a quantized model
            out["guards"] = [outcome(lambda: model.to(torch.float16)),
                             outcome(lambda: model.cuda()), outcome(lambda: model.half())]
        ids = torch.tensor(ids)
        with torch.no_grad():
            result = model(ids)
        for name in ("logits", "last_hidden_state"):
            result = getattr(result, name, result)
        out["output"] = result.tolist()
        if generate:
            out["tokens"] = model.generate(ids, max_new_tokens=8, min_new_tokens=8).tolist()
        out["hooked"] = sorted(n for n, m in model.named_modules() if "_hf_hook" in m.__dict__)
        out["move"] = outcome(lambda: model.to("cpu"))  # last: a move may rebuild parameters
        return out

    def activated(load):
        """``load()`` with the adapters' loaders patched, as a user's code runs after
        ``overmind.activate()``."""
        overmind.activate()
        try:
            return load()
        finally:
            overmind.deactivate()
''')


def first_and_second(env: dict, load: str, ids, generate: bool = True, setup: str = "",
                     plain: str | None = None) -> tuple[dict, dict, dict]:
    """Run ``load`` (an expression) in two fresh processes; the first also builds a fresh reference
    with ``plain`` (by default ``load`` with ``overmind.load(f, ...)`` replaced by ``f(...)``).

    Returns (reference observed in the first process, first process's cached result, second
    process's).
    """
    plain = plain or load.replace("overmind.load(", "(lambda f, *a, **k: f(*a, **k))(")
    first = run_fresh(PRELUDE + setup + textwrap.dedent(f'''
        reference = observe({plain}, {ids!r}, {generate})
        before = dict(QUANTIZE_CALLS)
        model = {load}
        # before any forward: 8-bit matmuls quantize their inputs with the same function
        quantized = {{k: QUANTIZE_CALLS[k] - before[k] for k in QUANTIZE_CALLS}}
        report({{"reference": reference, "cached": observe(model, {ids!r}, {generate}),
                 "quantized": quantized}})
    '''), env=env, timeout=600)
    second = run_fresh(PRELUDE + setup + textwrap.dedent(f'''
        model = {load}
        quantized = dict(QUANTIZE_CALLS)
        report({{**observe(model, {ids!r}, {generate}), "quantized": quantized}})
    '''), env=env, timeout=600)
    return first["reference"], {**first["cached"], "quantized": first["quantized"]}, second
