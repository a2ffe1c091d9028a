"""Hub ids resolve through the local Hugging Face cache (HF_HUB_OFFLINE=1): the commit is part of the key, so a
new snapshot gives a fresh load, and the same snapshot a hit."""
from __future__ import annotations

import pytest

from _support import tiny_models as tm

LOAD_HUB_ID = '''
from transformers import AutoModel, AutoTokenizer

overmind.activate()
model, new_model_entries, _ = counted_load(lambda: AutoModel.from_pretrained("tiny-org/tiny-bert"))
tok, new_tok_entries, _ = counted_load(lambda: AutoTokenizer.from_pretrained("tiny-org/tiny-bert"))
cached = tm.state_digest(model)
overmind.deactivate()
report({"new_entries": new_model_entries + new_tok_entries, "cached": cached,
        "plain": tm.state_digest(AutoModel.from_pretrained("tiny-org/tiny-bert")),
        "tokens": tok("the cat sat")["input_ids"]})
'''


@pytest.mark.long(44)  # seconds on a CI machine: conftest.py runs it early
def test_new_snapshot_gives_a_fresh_load(fresh, tmp_path):
    hub = tmp_path / "hub"
    _, rev_a = tm.build_hf_cache(hub, "tiny-org/tiny-bert", tm.build_bert(tmp_path / "bert-a", seed=0))
    env = {"HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "hf-home")}

    first = fresh(LOAD_HUB_ID, **env)
    assert first["new_entries"] >= 2 and first["cached"] == first["plain"]  # Auto entries and the nested ones
    again = fresh(LOAD_HUB_ID, **env)
    assert again["new_entries"] == 0 and again["cached"] == first["cached"]

    # A new snapshot (new weights) and refs/main moved to it: the same call must not be served the old entry.
    _, rev_b = tm.build_hf_cache(hub, "tiny-org/tiny-bert", tm.build_bert(tmp_path / "bert-b", seed=1))
    assert rev_b != rev_a
    moved = fresh(LOAD_HUB_ID, **env)
    assert moved["new_entries"] >= 1
    assert moved["cached"] == moved["plain"] != first["cached"]
