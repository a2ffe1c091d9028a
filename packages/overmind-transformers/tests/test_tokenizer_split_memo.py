"""Within one load, a tokenizer's split is reused only for a backend that serialises to the same text.

A cold pipeline load reduces its tokenizer twice (its own entry, then the pipeline's): the second reduce reuses
the first's split (``overmind.loading.scope``). Hypothesis runs programs of edits on tokenizers (added tokens,
special tokens, padding, truncation, ``split_special_tokens``, a changed ``_merges``) and reduces after each
edit inside one load's scope: every rebuild must behave like the tokenizer it was reduced from at that moment,
never like an earlier state. The memo is gone once no load runs.
"""
from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support import tiny_models as tm
from overmind import testing
from overmind.adapter import load_memo
from overmind_transformers import tokenizer_reduce
from overmind_transformers.tokenizer_reduce import reducers

TEXTS = ["a photo of the red cat", "<|startoftext|>a photo<|endoftext|> of abq <extra> <ctrl>", "  odd ünï ∑ x"]


def roundtrip(tok):
    return testing.roundtrip(tok, reducers(), storages=False)  # a tokenizer has no storages


def behaviour(tok):
    out = [(tok(t)["input_ids"], tok.tokenize(t), tok.decode(tok(t)["input_ids"])) for t in TEXTS]
    return (out, tok.backend_tokenizer.to_str(), tok.backend_tokenizer.encode_special_tokens, len(tok),
            {i: str(t) for i, t in tok.added_tokens_decoder.items()}, vars(tok).get("_merges"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from transformers import CLIPTokenizerFast as CLIPTokenizer

    return CLIPTokenizer.from_pretrained(tm.build_clip_tokenizer(tmp_path_factory.mktemp("clip"), extra_merges=200))


def _edit(tok, edit):
    kind, arg = edit
    backend = tok.backend_tokenizer
    if kind == "add":
        tok.add_tokens([f"<extra{arg}>"])
    elif kind == "special":
        tok.add_special_tokens({"additional_special_tokens": [f"<ctrl{arg}>"]})
    elif kind == "pad":
        backend.enable_padding(length=4 + arg)
    elif kind == "truncate":
        backend.enable_truncation(max_length=3 + arg)
    elif kind == "split":
        backend.encode_special_tokens = bool(arg % 2)
    elif kind == "merges":
        merges = vars(tok).get("_merges")
        vars(tok)["_merges"] = (merges + "#" if isinstance(merges, str) else list(merges or ()) + [("a", "b")])
    elif kind == "copy":  # a different object with the same content (as a rebuild gives): the split may be reused
        return roundtrip(tok)
    return tok


EDITS = st.tuples(st.sampled_from(["add", "special", "pad", "truncate", "split", "merges", "copy", "none"]),
                  st.integers(0, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(EDITS, min_size=1, max_size=5))
def test_each_reduce_in_one_load_rebuilds_the_tokenizer_as_it_was_then(clip, edits):
    tok = copy.deepcopy(clip)
    with testing.load_scope():
        expected, rebuilt = [], []
        for edit in edits:
            tok = _edit(tok, edit)
            expected.append(behaviour(tok))
            rebuilt.append(roundtrip(tok))  # now: later edits must not reach what this reduce wrote
        assert [behaviour(r) for r in rebuilt] == expected
    assert not testing.load_running()


def test_the_second_reduce_of_an_unchanged_tokenizer_reuses_the_split(clip, monkeypatch):
    calls = []
    real = tokenizer_reduce._split_backend
    monkeypatch.setattr(tokenizer_reduce, "_split_backend", lambda *a: calls.append(1) or real(*a))
    with testing.load_scope():
        first = roundtrip(clip)  # its own entry; the pipeline then holds this rebuilt one
        second = roundtrip(first)
        assert len(calls) == 1
        assert behaviour(first) == behaviour(second) == behaviour(clip)
        clip2 = roundtrip(clip)
        clip2.add_tokens(["<one-more>"])
        assert behaviour(roundtrip(clip2)) == behaviour(clip2)
        assert len(calls) == 2  # the rebuilt copy reused the split, the edited one did not
    assert load_memo("overmind_transformers.tokenizer_split") == {}  # nothing kept once no load runs
    roundtrip(clip)
    roundtrip(clip)
    assert len(calls) == 4  # outside a load nothing is reused


def test_memos_are_dropped_when_the_last_of_two_overlapping_loads_ends():
    with testing.load_scope():
        load_memo("x")["k"] = 1
        with testing.load_scope():
            assert load_memo("x") == {"k": 1}
        assert load_memo("x") == {"k": 1}  # the nested one ending keeps it
    assert not testing.load_running()
    assert load_memo("x") == {}
