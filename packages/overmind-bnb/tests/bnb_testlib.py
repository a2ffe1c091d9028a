"""Helpers for the overmind-bnb tests: a bitsandbytes-friendly tiny Llama, configs, pickling round trips.

Why not ``tiny_models.build_llama``: its hidden size is 32, and bitsandbytes 0.50's CPU 4-bit kernel (used on
CPUs with AVX512-BF16, as here, under ``torch.no_grad``) repacks weights in blocks of 64 input features and 32
output features; a 32-wide layer fails there with ``shape '[32, 0]' is invalid``. This model is 64 wide.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

PROMPT_IDS = [[1, 7, 12, 5, 9, 30, 4]]

# Code for fresh processes: count every quantization bitsandbytes performs (4-bit and 8-bit), in any path
# (transformers' quantizers and bare Linear4bit/Linear8bitLt both end in these two functions).
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
    """Save a tiny ``LlamaForCausalLM`` (2 layers, hidden 64, GQA) whose linear layers suit bnb's CPU kernels."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, pad_token_id=3, tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # large weights: greedy decoding does not collapse onto one token
            for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, do_sample=False)
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
    """An object pickled by Overmind's own pickler and rebuilt over one buffer standing in for the memfd.

    ``obj`` is the rebuilt object; :meth:`in_buffer` tells whether a tensor's bytes lie in that buffer (zero-copy).
    """

    def __init__(self, obj: Any, reducers: dict | None = None):
        from overmind import pickling

        from overmind_bnb.reducers import reducer_table

        pickled = pickling.dumps(obj, reducers if reducers is not None else reducer_table(), reference_mapped=False)
        self.pickler = pickled.pickler
        self.buffer = bytearray(max(pickled.data_len, 1))
        self.base = torch.frombuffer(self.buffer, dtype=torch.uint8)
        for storage, offset in pickled.storages:
            n = storage.nbytes()
            src = torch.empty(0, dtype=torch.uint8).set_(storage)
            self.base[offset:offset + n].copy_(src.flatten())
        self.obj = pickling.loads(pickled.skeleton, self._source, pickled.pickler)

    def _source(self, where: Any, offset: int, nbytes: int) -> torch.UntypedStorage:
        assert where is None
        if nbytes == 0:
            return torch.UntypedStorage(0)
        return torch.frombuffer(self.buffer, dtype=torch.uint8, count=nbytes, offset=offset).untyped_storage()

    def in_buffer(self, tensor: torch.Tensor) -> bool:
        lo = self.base.data_ptr()
        return lo <= tensor.data_ptr() and tensor.data_ptr() + tensor.nbytes <= lo + len(self.buffer)


def plain_roundtrip(obj: Any) -> Any:
    """Round trip through the standard library's pickle with the adapter's reducers (no Overmind pickler)."""
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
