"""A fast tokenizer rebuilt by the reducer is indistinguishable from the one pickled, on any text.

Each tokenizer (CLIP's BPE with ``</w>`` and its decode override, Llama's byte-fallback BPE, BERT's WordPiece and
the real all-MiniLM-L6-v2) goes through Overmind's pickler with the adapter's reducers and back, as a cache hit
does; then hypothesis throws random text (any Unicode, with the tokenizer's special and added tokens mixed in)
and random id lists at both and compares every output, and the attributes a user reads are compared once.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support import tiny_models as tm
from overmind import testing
from overmind_transformers.tokenizer_reduce import reducers

KINDS = ("clip", "clip-split", "llama", "bert", "minilm")
# Attributes a user reads off a tokenizer (each exists on transformers 4.57 and 5.x).
ATTRIBUTES = ("vocab_size", "model_max_length", "padding_side", "truncation_side", "name_or_path", "is_fast",
              "model_input_names", "clean_up_tokenization_spaces", "all_special_tokens", "all_special_ids",
              "special_tokens_map", "bos_token", "eos_token", "unk_token", "pad_token", "pad_token_id",
              "init_kwargs", "split_special_tokens")


def roundtrip(tok):
    return testing.roundtrip(tok, reducers(), storages=False)  # a tokenizer has no storages


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer
    from transformers import CLIPTokenizerFast as CLIPTokenizer  # the fast class on 4.x; the same class on 5.x

    root = tmp_path_factory.mktemp("tokenizers")
    clip = tm.build_clip_tokenizer(root / "clip", extra_merges=3000)
    out = {}
    for kind in KINDS:
        if kind == "clip":
            tok = CLIPTokenizer.from_pretrained(clip)
            # added tokens: one with a space, one stripping the spaces around it, a special one
            tok.add_tokens(["<extra-a>", "photo of", AddedToken("<strip>", lstrip=True, rstrip=True)])
            tok.add_special_tokens({"additional_special_tokens": ["<ctrl>"]})
        elif kind == "clip-split":
            tok = CLIPTokenizer.from_pretrained(clip, split_special_tokens=True)  # sets the backend's
            # encode_special_tokens, which its serialised form does not hold
        else:
            folder = tm.minilm_path() if kind == "minilm" else getattr(tm, f"build_{kind}")(root / kind)
            tok = AutoTokenizer.from_pretrained(folder)
        out[kind] = (tok, roundtrip(tok))
    return out


def specials(tok) -> list[str]:
    return sorted({str(t) for t in tok.added_tokens_decoder.values()} | set(tok.all_special_tokens))


def texts_for(tok) -> st.SearchStrategy[str]:
    """Any Unicode, with the tokenizer's special and added tokens, odd spacing and CLIP's suffix mixed in."""
    part = st.one_of(st.text(max_size=12), st.sampled_from(specials(tok)),
                     st.sampled_from([" ", "  ", "\n", "\t", "a photo of", "</w>"]))
    return st.lists(part, max_size=8).map("".join)


def encode_all(tok, text: str):
    enc = tok(text, return_offsets_mapping=True)
    ids = enc["input_ids"]
    return (ids, enc["attention_mask"], enc["offset_mapping"], tok.tokenize(text), tok.convert_ids_to_tokens(ids),
            tok.decode(ids), tok.decode(ids, skip_special_tokens=True), tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("kind", KINDS)
def test_the_rebuilt_tokenizer_has_the_same_attributes_and_backend(pairs, kind):
    tok, rebuilt = pairs[kind]
    assert type(rebuilt) is type(tok)
    assert type(rebuilt.backend_tokenizer) is type(tok.backend_tokenizer)
    for name in ATTRIBUTES:
        assert getattr(rebuilt, name) == getattr(tok, name), name
    assert len(rebuilt) == len(tok)
    assert rebuilt.get_vocab() == tok.get_vocab()
    assert {i: (str(t), t.special) for i, t in rebuilt.added_tokens_decoder.items()} == \
        {i: (str(t), t.special) for i, t in tok.added_tokens_decoder.items()}
    # The whole Rust tokenizer as it serialises itself: normalizer, pre-tokenizer, model (vocab, merges and
    # every option), post-processor, decoder, added tokens, padding and truncation.
    assert rebuilt.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert rebuilt.backend_tokenizer.encode_special_tokens == tok.backend_tokenizer.encode_special_tokens
    plain_state = {k: v for k, v in vars(tok).items() if k != "_tokenizer"}
    assert {k: v for k, v in vars(rebuilt).items() if k != "_tokenizer"} == plain_state


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_text_encodes_and_decodes_the_same(pairs, kind, data):
    tok, rebuilt = pairs[kind]
    text = data.draw(texts_for(tok))
    assert encode_all(rebuilt, text) == encode_all(tok, text)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_batches_and_ids_match(pairs, kind, data):
    tok, rebuilt = pairs[kind]
    texts = data.draw(st.lists(st.text(max_size=30), min_size=1, max_size=4))
    length = data.draw(st.integers(min_value=2, max_value=24))
    if tok.pad_token is not None:
        kw = {"padding": "max_length", "truncation": True, "max_length": length}
        assert rebuilt(texts, **kw)["input_ids"] == tok(texts, **kw)["input_ids"]
    ids = data.draw(st.lists(st.integers(min_value=0, max_value=len(tok) - 1), max_size=20))
    assert rebuilt.decode(ids) == tok.decode(ids)
    assert rebuilt.convert_ids_to_tokens(ids) == tok.convert_ids_to_tokens(ids)
