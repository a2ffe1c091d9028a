"""Every patched transformers entry point, loaded in one fresh process (publishes) and again in a second fresh
process (must be served from the entries the first published), compared with a plain load of the same thing.

The second process computes the plain result itself after ``overmind.deactivate()``, so "cached" and "plain"
are compared under identical conditions, bitwise.
"""
from __future__ import annotations

import shutil

ENTRY_POINTS = '''
import numpy as np
from transformers import (AutoFeatureExtractor, AutoImageProcessor, AutoModel, AutoModelForCausalLM, AutoProcessor,
                          AutoTokenizer, BertModel, BertTokenizer, CLIPProcessor, LlamaForCausalLM,
                          Pipeline, PreTrainedTokenizerBase, ProcessorMixin, Wav2Vec2FeatureExtractor, pipeline)
from transformers.feature_extraction_utils import FeatureExtractionMixin
from transformers.image_processing_base import ImageProcessingMixin
try:
    from transformers import CLIPImageProcessorPil as CLIPImageProcessor
except ImportError:
    from transformers import CLIPImageProcessor

overmind.activate()
TEXT = "the big cat sat on the mat"
IMAGE = tm.sd_control_image(1)
AUDIO = np.sin(np.linspace(0, 40, 1600)).astype(np.float32)


def outputs(obj):
    """What obj produces on fixed inputs, as digests (bitwise comparison)."""
    if isinstance(obj, torch.nn.Module):
        with torch.no_grad():
            o = obj(torch.tensor([[1, 5, 7, 9, 3]]))
        t = o.last_hidden_state if hasattr(o, "last_hidden_state") else o.logits
        return [tm.state_digest(obj), tm.tensor_digest(t), str(obj.dtype), str(obj.device),
                str(getattr(obj, "hf_device_map", None))]
    if isinstance(obj, Pipeline):
        return [type(obj).__name__, tm.tensor_digest(torch.tensor(obj(TEXT)))]
    if isinstance(obj, ProcessorMixin):
        enc = obj(text=TEXT, images=IMAGE, return_tensors="pt")
        return [type(obj).__name__] + [tm.tensor_digest(enc[k]) for k in sorted(enc.keys())]
    if isinstance(obj, PreTrainedTokenizerBase):
        enc = obj(TEXT)
        return [type(obj).__name__, enc["input_ids"], obj.decode(enc["input_ids"]), len(obj)]
    if isinstance(obj, FeatureExtractionMixin):
        return [type(obj).__name__, tm.tensor_digest(obj(AUDIO, sampling_rate=16000, return_tensors="pt")["input_values"])]
    if isinstance(obj, ImageProcessingMixin):
        return [type(obj).__name__, tm.tensor_digest(obj(IMAGE, return_tensors="pt")["pixel_values"])]
    raise AssertionError(f"no output for {type(obj)}")


LOADS = {
    "BertModel.from_pretrained": lambda: BertModel.from_pretrained(P["bert"]),
    "AutoModel.from_pretrained": lambda: AutoModel.from_pretrained(P["bert"]),
    "LlamaForCausalLM dtype=torch.float16": lambda: LlamaForCausalLM.from_pretrained(P["llama"], dtype=torch.float16),
    "LlamaForCausalLM torch_dtype=torch.float16": lambda: LlamaForCausalLM.from_pretrained(P["llama"], torch_dtype=torch.float16),
    "LlamaForCausalLM dtype='float16'": lambda: LlamaForCausalLM.from_pretrained(P["llama"], dtype="float16"),
    "AutoModelForCausalLM device_map='cpu'": lambda: AutoModelForCausalLM.from_pretrained(P["llama"], device_map="cpu"),
    "AutoTokenizer.from_pretrained": lambda: AutoTokenizer.from_pretrained(P["bert"]),
    "BertTokenizer.from_pretrained": lambda: BertTokenizer.from_pretrained(P["bert"]),
    "AutoProcessor.from_pretrained": lambda: AutoProcessor.from_pretrained(P["processor"]),
    "CLIPProcessor.from_pretrained": lambda: CLIPProcessor.from_pretrained(P["processor"]),
    "AutoImageProcessor.from_pretrained": lambda: AutoImageProcessor.from_pretrained(P["processor"]),
    "CLIPImageProcessor.from_pretrained": lambda: CLIPImageProcessor.from_pretrained(P["processor"]),
    "AutoFeatureExtractor.from_pretrained": lambda: AutoFeatureExtractor.from_pretrained(P["feature_extractor"]),
    "Wav2Vec2FeatureExtractor.from_pretrained": lambda: Wav2Vec2FeatureExtractor.from_pretrained(P["feature_extractor"]),
    "transformers.pipeline": lambda: pipeline("feature-extraction", model=P["bert"], tokenizer=P["bert"]),
}
cached = {}
for name, load in LOADS.items():
    obj, new_entries, hits = counted_load(load)
    cached[name] = {"outputs": outputs(obj), "new_entries": new_entries, "hits": hits,
                    "mapped": all_mapped(obj) if isinstance(obj, torch.nn.Module)
                              else all_mapped(obj.model) if isinstance(obj, Pipeline) else None}
overmind.deactivate()
plain = {name: outputs(load()) for name, load in LOADS.items()}
report({"cached": cached, "plain": plain})
'''


def test_every_entry_point_served_in_a_fresh_process_equals_plain(fresh):
    first = fresh(ENTRY_POINTS)
    second = fresh(ENTRY_POINTS)
    for name, got in first["cached"].items():
        assert got["outputs"] == first["plain"][name], f"{name}: first (publishing) load differs from a plain load"
    # The dtype spellings are one entry: only the first of the three Llama loads creates one.
    assert first["cached"]["LlamaForCausalLM dtype=torch.float16"]["new_entries"] == 1
    assert first["cached"]["LlamaForCausalLM torch_dtype=torch.float16"]["new_entries"] == 0
    assert first["cached"]["LlamaForCausalLM dtype='float16'"]["new_entries"] == 0
    for name, got in second["cached"].items():
        assert got["new_entries"] == 0, f"{name}: the second process loaded it again instead of hitting"
        assert got["hits"] >= 1, f"{name}: no hit in the second process"
        assert got["outputs"] == second["plain"][name], f"{name}: cached object differs from a plain load"
        if got["mapped"] is not None:
            assert got["mapped"], f"{name}: weights not mapped from Overmind shared memory"
    assert second["cached"]["LlamaForCausalLM dtype=torch.float16"]["outputs"][2] == "torch.float16"
    device_map = second["cached"]["AutoModelForCausalLM device_map='cpu'"]["outputs"]
    assert device_map[3] == "cpu" and device_map[4] == second["plain"]["AutoModelForCausalLM device_map='cpu'"][4]
    assert second["cached"]["transformers.pipeline"]["mapped"] is True  # the pipeline's model is mapped


REAL_MODELS = '''
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

overmind.activate()
SENTENCES = ["A man is eating food.", "Overmind maps the weights once per machine."]


def minilm_embeddings(model, tok):
    enc = tok(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return tm.tensor_digest(torch.nn.functional.normalize(pooled, dim=1))


def llama_tokens(model, tok):
    ids = tok(tm.LLAMA_PROMPT, return_tensors="pt").input_ids
    return model.generate(ids, max_new_tokens=12, do_sample=False).tolist()


def remote_output(model):
    with torch.no_grad():
        return tm.tensor_digest(model(torch.tensor([[1, 2, 3, 39]])))


def run_all(get):
    minilm_model, minilm_tok = get(lambda: AutoModel.from_pretrained(P["minilm"])), get(lambda: AutoTokenizer.from_pretrained(P["minilm"]))
    llama_model, llama_tok = get(lambda: AutoModelForCausalLM.from_pretrained(P["llama"])), get(lambda: AutoTokenizer.from_pretrained(P["llama"]))
    remote = get(lambda: AutoModel.from_pretrained(P["remote"], trust_remote_code=True))
    return {"minilm": minilm_embeddings(minilm_model, minilm_tok), "llama": llama_tokens(llama_model, llama_tok),
            "remote": remote_output(remote), "remote_class": type(remote).__module__ + "." + type(remote).__qualname__}


counts = {"new_entries": 0, "hits": 0, "unmapped": []}
def through_cache(load):
    obj, new_entries, hits = counted_load(load)
    counts["new_entries"] += new_entries
    counts["hits"] += hits
    if isinstance(obj, torch.nn.Module) and not all_mapped(obj):
        counts["unmapped"].append(type(obj).__name__)
    return obj

modules_before = sorted(m for m in sys.modules if m.startswith("transformers_modules"))
cached = run_all(through_cache)
own_cache = os.path.join(os.environ["HF_MODULES_CACHE"], "transformers_modules", "tiny_remote")
remote_in_own_cache = os.path.exists(own_cache)
overmind.deactivate()
plain = run_all(lambda load: load())
report({"cached": cached, "plain": plain, "counts": counts, "modules_before": modules_before,
        "remote_in_own_cache": remote_in_own_cache})
'''


def test_minilm_llama_and_remote_code_in_a_fresh_process(fresh, tmp_path):
    first_modules = tmp_path / "first-modules"
    first = fresh(REAL_MODELS, HF_MODULES_CACHE=str(first_modules))
    assert first["remote_in_own_cache"]  # the first process ran the remote code from its modules cache
    shutil.rmtree(first_modules)  # ... which is gone now: the second can only get the code from the entry
    assert first["counts"]["new_entries"] > 0
    assert first["cached"] == first["plain"]
    second = fresh(REAL_MODELS)
    assert second["counts"]["new_entries"] == 0, "the second process loaded something again instead of hitting"
    assert second["counts"]["hits"] >= 5
    assert second["counts"]["unmapped"] == []
    # MiniLM embeddings bitwise equal, Llama generates the same tokens, the remote-code model computes the same.
    assert second["cached"] == second["plain"] == first["plain"]
    assert second["cached"]["remote_class"].startswith("transformers_modules.tiny_remote.")
    # The second process never ran the remote code from a modules cache: the class came from the entry.
    assert second["modules_before"] == []
    assert not second["remote_in_own_cache"]
