"""File entries with real transformers: a safetensors checkpoint loaded without conversion is served
from the checkpoint file itself (no memfd copy of its weights), one converted on load from memfd copies, and both
equal the plain load bitwise in a fresh process; a checkpoint saved again over the same folder is never served
from the old entry.
"""
from __future__ import annotations

import os
import shutil

import overmind

WHERE = '''
from transformers import BertModel, LlamaForCausalLM
from overmind.testing import mapped_path

overmind.activate()


def mapped_file(t):
    name = mapped_path(t.untyped_storage().data_ptr())
    return "?" if name is None else name


def outputs(model):
    with torch.no_grad():
        o = model(torch.tensor([[1, 5, 7, 9, 3]]))
    t = o.last_hidden_state if hasattr(o, "last_hidden_state") else o.logits
    return [type(model).__name__, str(model.dtype), tm.state_digest(model), tm.tensor_digest(t)]


LOADS = {
    "bert": lambda: BertModel.from_pretrained(os.environ["BERT"]),
    "llama fp16": lambda: LlamaForCausalLM.from_pretrained(P["llama"], dtype=torch.float16),
}
cached, where, counts = {}, {}, {}
for name, load in LOADS.items():
    obj, new_entries, hits = counted_load(load)
    cached[name] = outputs(obj)
    counts[name] = [new_entries, hits]
    where[name] = sorted({mapped_file(t) for t in obj.state_dict().values() if t.numel()})
overmind.deactivate()
plain = {name: outputs(load()) for name, load in LOADS.items()}
report({"cached": cached, "plain": plain, "where": where, "counts": counts})
'''


def _bert_copy(tiny, tmp_path) -> str:
    folder = str(tmp_path / "bert")
    shutil.copytree(tiny["bert"], folder)
    return folder


def test_an_unconverted_checkpoint_is_served_from_its_file_and_equals_plain(fresh, tiny, tmp_path):
    bert = _bert_copy(tiny, tmp_path)
    weights = os.path.join(bert, "model.safetensors")
    first = fresh(WHERE, BERT=bert)
    second = fresh(WHERE, BERT=bert)
    for got in (first, second):
        assert got["cached"] == got["plain"]
    assert second["counts"] == {"bert": [0, 1], "llama fp16": [0, 1]}
    assert second["where"]["bert"] == [weights], "the weights are the checkpoint file's own pages"
    assert all(w.startswith("/memfd:overmind") for w in second["where"]["llama fp16"]), "converted: copied"
    info = overmind.cache_info(processes=False)
    by_loader = {e.short_loader: e for e in info.entries}
    bert_entry = by_loader["BertModel.from_pretrained"]
    assert [f.path for f in bert_entry.files] == [weights]
    assert bert_entry.nbytes < os.path.getsize(weights) // 4, "no memfd copy of the weights"
    assert not by_loader["LlamaForCausalLM.from_pretrained"].files


def test_a_checkpoint_saved_again_in_its_folder_is_loaded_again(fresh, tiny, tmp_path):
    import torch
    from transformers import BertModel

    bert = _bert_copy(tiny, tmp_path)
    first = fresh(WHERE, BERT=bert)
    assert first["cached"] == first["plain"]
    model = BertModel.from_pretrained(bert)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2)
    model.save_pretrained(bert)
    second = fresh(WHERE, BERT=bert)
    assert second["counts"]["bert"] == [1, 0], "the changed checkpoint must be loaded again"
    assert second["cached"] == second["plain"] and second["cached"]["bert"] != first["cached"]["bert"]
