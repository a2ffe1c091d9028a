"""PEFT's ``PeftModel.from_pretrained(model, lora_dir)`` injects its LoRA layers into ``model`` in place (each holds
the layer it replaces), freezes ``model``'s parameters, and initialises the LoRA weights at random before loading
them. Through ``overmind.load`` it is served: a hit returns the PeftModel around the caller's ``model`` and makes the
same changes to it (``loading/writes/arguments.py``).

A plain process and two Overmind processes (fresh, against one server, never seeded) each build the base model and
call PEFT; each reports the base model afterwards (which class is where, which layer holds the original, gradient
flags) and the output. The second Overmind process must be served the PeftModel without running PEFT's loader. (A
seeded process is served the variant of its generator's state, as any drawing loader: core's test_random_variants.)
"""
from __future__ import annotations

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh

pytest.importorskip("peft")

SCRIPT = """
import hashlib, logging, os
import overmind
overmind.activate()
import torch
from peft import PeftModel
from transformers import BertModel
from overmind.testing import report
served = []
handler = logging.Handler()
handler.emit = lambda r: served.append(r.getMessage().startswith("hit peft"))
logging.getLogger("overmind").addHandler(handler)
logging.getLogger("overmind").setLevel(logging.INFO)
via = os.environ.get("VIA") == "overmind"
base = overmind.load(BertModel.from_pretrained, os.environ["BERT"]) if via else BertModel.from_pretrained(
    os.environ["BERT"])
query = base.encoder.layer[0].attention.self.query
model = (overmind.load(PeftModel.from_pretrained, base, os.environ["LORA"]) if via
         else PeftModel.from_pretrained(base, os.environ["LORA"]))
with torch.no_grad():
    out = model(input_ids=torch.tensor([[2, 7, 9, 3]])).last_hidden_state
report({"out": hashlib.sha256(out.numpy().tobytes()).hexdigest(), "class": type(model).__name__,
        "wraps_base": model.base_model.model is base,
        "holds_original": base.encoder.layer[0].attention.self.query.base_layer is query,
        "modules": [(n, type(m).__module__ + "." + type(m).__qualname__) for n, m in base.named_modules()],
        "grads": [p.requires_grad for p in base.parameters()], "training": base.training,
        "served": any(served)})
"""


@pytest.fixture(scope="module")
def bert_and_lora(tmp_path_factory):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertModel

    from _support.tiny_models import build_bert

    root = tmp_path_factory.mktemp("peft")
    bert = build_bert(root / "bert")
    torch.manual_seed(1)
    lora = get_peft_model(BertModel.from_pretrained(bert), LoraConfig(r=2, target_modules=["query", "value"]))
    for name, param in lora.named_parameters():
        if "lora_B" in name:  # zeros as initialised: give the adapter weights that change the output
            param.data.normal_(0, 0.1)
    lora.save_pretrained(root / "lora")
    return str(bert), str(root / "lora")


def test_peft_is_served_and_changes_the_callers_base_model_as_plain_does(overmind_runtime, bert_and_lora):
    bert, lora = bert_and_lora
    env = {"PYTHONPATH": pythonpath_env(), "OVERMIND_RUNTIME_DIR": overmind_runtime, "BERT": bert, "LORA": lora}
    plain = run_fresh(SCRIPT, env={**env, "VIA": "plain"})
    assert plain["wraps_base"] and plain["holds_original"] and not any(plain["grads"])
    got = [run_fresh(SCRIPT, env={**env, "VIA": "overmind"}) for _ in range(2)]
    assert [g.pop("served") for g in got] == [False, True]
    plain.pop("served")
    assert got == [plain] * 2
