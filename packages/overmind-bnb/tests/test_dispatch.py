"""accelerate's dispatch hooks and move guards: off for pickling, back exactly in the loading process, rebuilt
on the cached copy so it behaves like a fresh dispatched model (outputs, hooks, warnings and errors).

On a CPU-only machine from_pretrained dispatches a bitsandbytes load with hooks when the device map offloads
to disk (``llm_int8_enable_fp32_cpu_offload=True``); a quantized model dispatched by the user's own loader with
``accelerate.dispatch_model(force_hooks=True)`` covers hooks over quantized layers and tied weights.
"""
from __future__ import annotations

import contextlib
import logging
import pickle

import pytest
import torch
from accelerate import dispatch_model
from bitsandbytes.nn import Linear4bit, Params4bit
from transformers import AutoModelForCausalLM

from overmind_bnb import dispatch, packing, plugin
from overmind_bnb_testlib import PROMPT_IDS, Roundtrip, config_4bit, plain_roundtrip

IDS = torch.tensor(PROMPT_IDS)
DISK_MAP = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
            "lm_head": "disk"}


@pytest.fixture
def offloaded(llama_path, tmp_path):
    """A bitsandbytes 4-bit load whose lm_head is offloaded to disk: dispatched with hooks and guards."""
    def load():
        return AutoModelForCausalLM.from_pretrained(
            llama_path, quantization_config=config_4bit(llm_int8_enable_fp32_cpu_offload=True),
            device_map=DISK_MAP, offload_folder=str(tmp_path / "offload"))
    return load


def load_dispatched_quantized(path):
    """A user's loader: quantize on the CPU, then dispatch with accelerate (hooks over Linear4bit layers)."""
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config_4bit(), device_map="cpu")
    return dispatch_model(model, device_map={"": "cpu"}, force_hooks=True)


def instance_state(model) -> dict:
    """Every instance attribute accelerate sets, by module name, as object ids."""
    names = ("forward", "_old_forward", "_hf_hook") + dispatch.GUARDED_METHODS
    return {(n, a): id(m.__dict__[a]) for n, m in model.named_modules() for a in names if a in m.__dict__}


def cached_copy(model):
    """What Overmind does: prepare (strip) -> pickle -> unpickle -> after_unpickle."""
    cm = plugin.overmind_prepare_result(model, loader=None)
    assert cm is not None
    with cm:
        copy = Roundtrip(model).obj
    assert plugin.overmind_after_unpickle(copy, {}) is None
    return copy


def outcome(call):
    try:
        call()
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok"


def test_strip_leaves_a_picklable_model_and_restores_the_same_objects(offloaded):
    model = offloaded()
    before = instance_state(model)
    assert ("", "to") in before and ("lm_head", "forward") in before
    with pytest.raises(Exception):  # noqa: B017  (whatever pickle raises for them)
        pickle.dumps(model)  # accelerate's local functions
    with plugin.overmind_prepare_result(model, loader=None):
        assert instance_state(model) == {}  # the modules look undispatched to other adapters' checks
        record = model.__dict__[dispatch.MARKER]
        # the move guards accelerate put on the model (.to and .cuda before accelerate 1.16, .to since)
        assert record["guards"] == [[n, a] for n, a in before if a in dispatch.GUARDED_METHODS]
        assert ["", "to"] in record["guards"]
        assert [name for name, _ in record["hooked"]] == [n for n, m in model.named_modules() if (n, "_hf_hook") in before]
        plain_roundtrip(model)
    assert instance_state(model) == before and dispatch.MARKER not in model.__dict__


def test_cached_offloaded_model_behaves_like_a_fresh_one(offloaded, caplog):
    fresh, model = offloaded(), offloaded()
    copy = cached_copy(model)
    assert {k for k in instance_state(copy)} == {k for k in instance_state(fresh)}
    assert dispatch.MARKER not in copy.__dict__
    assert copy.lm_head.weight.device.type == "meta"  # still offloaded; the hook brings it in per forward
    with torch.no_grad():
        assert torch.equal(copy(IDS).logits, fresh(IDS).logits)
    for call in (lambda m: m.to("cpu"), lambda m: m.to(torch.float16), lambda m: m.cuda(), lambda m: m.half()):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            expected = outcome(lambda: call(fresh))  # noqa: B023  (called at once, in this iteration)
            fresh_log = [r.getMessage() for r in caplog.records]
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = outcome(lambda: call(copy))  # noqa: B023  (called at once, in this iteration)
            copy_log = [r.getMessage() for r in caplog.records]
        assert got == expected and copy_log == fresh_log
    assert outcome(lambda: copy.to("cpu"))[0] == "RuntimeError"


def test_dispatched_quantized_model_with_tied_weights(tied_llama_path):
    fresh, model = load_dispatched_quantized(tied_llama_path), load_dispatched_quantized(tied_llama_path)
    copy = cached_copy(model)
    assert type(copy.model.layers[0].mlp.up_proj) is Linear4bit
    assert type(copy.model.layers[0].mlp.up_proj.weight) is Params4bit
    hook_map = copy.model.layers[0]._hf_hook.tied_params_map
    assert hook_map is copy.lm_head._hf_hook.tied_params_map  # still one shared dict
    assert set(hook_map) == {copy.lm_head.weight.data_ptr()} == {copy.model.embed_tokens.weight.data_ptr()}
    with torch.no_grad():
        assert torch.equal(copy(IDS).logits, fresh(IDS).logits)
    assert torch.equal(copy.generate(IDS, max_new_tokens=6, min_new_tokens=6),
                       fresh.generate(IDS, max_new_tokens=6, min_new_tokens=6))
    assert outcome(lambda: copy.to(torch.float16)) == outcome(lambda: fresh.to(torch.float16))


def test_undispatched_or_unquantized_results_are_left_alone(llama_path):
    model = AutoModelForCausalLM.from_pretrained(llama_path, quantization_config=config_4bit(), device_map="cpu")
    before = dict(model.__dict__)
    cm = plugin.overmind_prepare_result(model, loader=None)
    # Nothing to strip; on a CPU whose bitsandbytes repacks 4-bit weights (AVX512-BF16, as here) the context
    # adds the precomputed packing beside the model for pickling and nothing else (test_variants_matrix.py).
    assert (cm is not None) == packing.has_repackable(model)
    with cm or contextlib.nullcontext():
        assert dispatch.MARKER not in model.__dict__
        assert (packing.MARKER in model.__dict__) == (cm is not None)
    assert model.__dict__ == before
    plain = dispatch_model(AutoModelForCausalLM.from_pretrained(llama_path), device_map={"": "cpu"}, force_hooks=True)
    assert plugin.overmind_prepare_result(plain, loader=None) is None  # overmind-transformers' business
    assert plugin.overmind_prepare_result({"a": 1}, loader=None) is None
