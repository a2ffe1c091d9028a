"""The user's code unchanged: ``overmind.activate()`` then ``AutoModelForCausalLM.from_pretrained(...)``.

overmind-transformers patches ``from_pretrained``; this adapter makes the quantized result cacheable, including
a model accelerate dispatched with hooks (here: lm_head offloaded to disk, the dispatch a CPU-only machine gets).
"""
from __future__ import annotations

import pytest

from overmind_bnb_testlib import CONFIGS, PROMPT_IDS, first_and_second

pytest.importorskip("overmind_transformers")
ENV = {"OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1"}


def test_activate_then_from_pretrained_in_4bit(overmind_runtime, llama_path):
    call = f"AutoModelForCausalLM.from_pretrained({str(llama_path)!r}, quantization_config={CONFIGS['4bit-nf4-double']}, device_map='cpu')"
    reference, first, second = first_and_second(ENV, f"activated(lambda: {call})", PROMPT_IDS, plain=call)
    assert first["quantized"]["4bit"] > 0 and second["quantized"] == {"4bit": 0, "8bit": 0}
    assert second["mapped"][0] == second["mapped"][1] > 0
    assert second["all_mapped"][0] == second["all_mapped"][1]
    for got in (first, second):
        assert {k: got[k] for k in ("output", "tokens", "guards", "types", "hooked", "move")} == \
               {k: reference[k] for k in ("output", "tokens", "guards", "types", "hooked", "move")}


def test_activate_then_dispatched_offloaded_model(overmind_runtime, llama_path, tmp_path):
    device_map = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
                  "lm_head": "disk"}
    config = CONFIGS["4bit-nf4-double"][:-1] + ", llm_int8_enable_fp32_cpu_offload=True)"
    call = (f"AutoModelForCausalLM.from_pretrained({str(llama_path)!r}, quantization_config={config}, "
            f"device_map={device_map!r}, offload_folder={str(tmp_path / 'offload')!r})")
    reference, first, second = first_and_second(ENV, f"activated(lambda: {call})", PROMPT_IDS, plain=call)
    assert "lm_head" in reference["hooked"] and reference["move"][0] == "RuntimeError"
    assert second["all_mapped"][0] == second["all_mapped"][1] > 0  # a cache hit: every weight is shared memory
    for got in (first, second):
        assert {k: got[k] for k in ("output", "tokens", "guards", "hooked", "move")} == \
               {k: reference[k] for k in ("output", "tokens", "guards", "hooked", "move")}
