"""BitsAndBytesConfig as a cache-key value, and the key parts a quantizing call adds."""
from __future__ import annotations

import torch
from transformers import BitsAndBytesConfig

from overmind.testing import canonical_form
from overmind_bnb import plugin
from overmind_bnb.keys import config_stand_in, key_parts


def canon(value):
    """The core's canonical form with this adapter's hook, as ``overmind.load`` computes it."""
    return canonical_form(value, plugin.overmind_key_for_value)


def test_explicit_defaults_and_dtype_spellings_give_one_key():
    a = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)
    b = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="float16",
                           llm_int8_threshold=6.0)
    assert canon(a) == canon(b)


def test_every_quantization_choice_changes_the_key():
    base = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    variants = [base, {**base, "bnb_4bit_quant_type": "fp4"}, {**base, "bnb_4bit_use_double_quant": False},
                {**base, "bnb_4bit_compute_dtype": torch.bfloat16}, {"load_in_8bit": True},
                {"load_in_8bit": True, "llm_int8_threshold": 5.0}, {**base, "llm_int8_skip_modules": ["lm_head"]}]
    keys = {repr(canon(BitsAndBytesConfig(**v))) for v in variants}
    assert len(keys) == len(variants)


def test_stand_in_is_plain_data():
    stand_in = config_stand_in(BitsAndBytesConfig(load_in_8bit=True))
    assert stand_in[0] == "BitsAndBytesConfig" and stand_in[1] == "transformers.utils.quantization_config"

    def plain(v):
        if isinstance(v, dict):
            return all(type(k) is str and plain(x) for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return all(plain(x) for x in v)
        return v is None or type(v) in (bool, int, float, str, bytes)

    assert plain(stand_in) and stand_in[2]["quant_method"] == "bitsandbytes"


def test_other_values_are_not_ours():
    assert plugin.overmind_key_for_value(object()) is None
    assert plugin.overmind_key_for_value({"load_in_4bit": True}) is None


def test_key_parts_only_for_quantizing_calls():
    import bitsandbytes

    parts = key_parts({"pretrained_model_name_or_path": "x", "quantization_config": BitsAndBytesConfig(load_in_4bit=True)})
    assert parts == [("bitsandbytes", bitsandbytes.__version__, "cuda_devices", 0)]
    assert key_parts({"pretrained_model_name_or_path": "x", "quantization_config": None}) is None


def test_diffusers_config_is_keyed_too():
    import pytest

    diffusers_config = pytest.importorskip("diffusers.quantizers.quantization_config")
    c = diffusers_config.BitsAndBytesConfig(load_in_4bit=True)
    assert canon(c)[0] == "adapter" and canon(c) != canon(BitsAndBytesConfig(load_in_4bit=True))
