"""When the adapter cannot cache a load, the user gets the plain result and one warning that names the
adapter, the loader, the versions and the fix; a load not cached by design (disk offload) is logged, not warned. ``active``, ``overmind_warnings``: tests/_support/adapter_testlib.py."""
from __future__ import annotations

import logging
import warnings

import torch

import overmind
from _support import tiny_models as tm
from _support.adapter_testlib import overmind_warnings


def test_unpicklable_model_warns_and_returns_the_plain_load(active, tmp_path):
    import transformers

    folder = tm.build_bert(tmp_path / "bert")

    class StreamingBert(transformers.BertModel):  # a generator attribute: neither pickle nor dill can store it
        def __init__(self, config):
            super().__init__(config)
            self.stream = (i for i in range(3))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = StreamingBert.from_pretrained(folder)
    messages = overmind_warnings(caught)
    assert len(messages) == 1, messages
    assert "adapter transformers (overmind-transformers 0.1.0, transformers " + transformers.__version__ in messages[0]
    assert "StreamingBert.from_pretrained" in messages[0] and "returned the plain result" in messages[0]
    overmind.deactivate()
    assert tm.state_digest(model) == tm.state_digest(transformers.BertModel.from_pretrained(folder))
    assert next(model.stream) == 0


def test_offloaded_model_is_not_cached_by_design_logged_not_warned(active, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    folder = tm.build_llama(tmp_path / "llama")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="overmind"):
        warnings.simplefilter("always")
        model = AutoModelForCausalLM.from_pretrained(folder, device_map={"model": "cpu", "lm_head": "disk"},
                                                     offload_folder=str(tmp_path / "offload"))
    assert overmind_warnings(caught) == []
    said = [r.getMessage() for r in caplog.records if "dispatched by accelerate" in r.getMessage()]
    assert said and "adapter transformers" in said[0] and "device_map" in said[0]
    overmind.deactivate()
    plain = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)
