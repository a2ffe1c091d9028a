"""PEFT's ``PeftModel.from_pretrained(model, lora_dir)`` injects its LoRA layers into ``model`` in place (and
initialises them at random before loading their weights). A hit could not make that change to the caller's
model, so through ``overmind.load`` the call runs plain every time: its result and the changed base model are
the plain call's, and one INFO line names the argument (never a warning). The base model's own load is still
served from the cache."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

import overmind
from overmind.fallback import OvermindWarning

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def bert_and_lora(tmp_path_factory):
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
    return bert, root / "lora"


def _outputs(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[2, 7, 9, 3]])).last_hidden_state


def _plain(bert, lora) -> tuple[torch.Tensor, list[str]]:
    from peft import PeftModel
    from transformers import BertModel

    torch.manual_seed(0)
    base = BertModel.from_pretrained(bert)
    model = PeftModel.from_pretrained(base, lora)
    return _outputs(model), sorted(n for n, _ in base.named_modules() if "lora" in n)


def test_peft_on_a_cached_base_model_runs_plain_and_names_the_argument(overmind_runtime, bert_and_lora, caplog):
    from peft import PeftModel
    from transformers import BertModel

    bert, lora = bert_and_lora
    expected, injected = _plain(bert, lora)
    caplog.set_level(logging.INFO, logger="overmind")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OvermindWarning)
        for _ in range(2):
            torch.manual_seed(0)
            base = overmind.load(BertModel.from_pretrained, bert)
            model = overmind.load(PeftModel.from_pretrained, base, lora)
            assert type(model) is PeftModel and model.base_model.model is base
            assert sorted(n for n, _ in base.named_modules() if "lora" in n) == injected  # changed in place
            assert torch.equal(_outputs(model), expected)
    lines = [r.getMessage() for r in caplog.records if "not caching" in r.getMessage()]
    assert len(lines) == 2 and all("its argument 'model'" in line for line in lines), lines
    info = overmind.cache_info()
    assert sum(entry.hits for entry in info.entries) >= 1  # the base model's second load was served
