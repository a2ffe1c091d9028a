"""The fast-tokenizer reducer rebuilds a tokenizer that behaves exactly like the original (and like a fresh load),
including what default pickling loses."""
from __future__ import annotations

import json
import pickle

import pytest

from _support import tiny_models as tm
from overmind import testing
from overmind_transformers.tokenizer_reduce import reduce_fast_tokenizer, reducers

TEXTS = ["a photo of the red cat", "<|startoftext|>a photo<|endoftext|> of abq", "  odd   spacing\tand ünïcode ∑"]


def roundtrip(obj):
    return testing.roundtrip(obj, reducers(), storages=False)  # a tokenizer has no storages


def behaviour(tok):
    out = []
    for text in TEXTS:
        enc = tok(text)
        out.append((enc["input_ids"], enc["attention_mask"], tok.decode(enc["input_ids"]),
                    tok.decode(enc["input_ids"], skip_special_tokens=True), tok.tokenize(text)))
    batch = tok(TEXTS, padding="max_length", truncation=True, max_length=12)
    return (out, batch["input_ids"], tok.get_vocab(), {i: str(t) for i, t in tok.added_tokens_decoder.items()},
            tok.all_special_tokens, tok.backend_tokenizer.encode_special_tokens, len(tok), tok.name_or_path)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return tm.build_clip_tokenizer(tmp_path_factory.mktemp("clip"), extra_merges=3000)


def test_clip_tokenizer_rebuilds_exactly(clip_dir):
    from transformers import CLIPTokenizerFast as CLIPTokenizer  # the fast class on 4.x; the same class on 5.x

    tok = CLIPTokenizer.from_pretrained(clip_dir)
    rebuilt = roundtrip(tok)
    assert type(rebuilt) is CLIPTokenizer
    assert behaviour(rebuilt) == behaviour(tok) == behaviour(CLIPTokenizer.from_pretrained(clip_dir))
    assert "</w>" not in rebuilt.decode(rebuilt("a photo").input_ids)  # CLIP's decode override is back


def test_default_pickling_loses_clip_decode_override(clip_dir):
    """Why the reducer exists (besides speed): if this starts passing, default pickling became faithful."""
    from transformers import CLIPTokenizerFast as CLIPTokenizer  # the fast class on 4.x; the same class on 5.x

    tok = CLIPTokenizer.from_pretrained(clip_dir)
    plain = pickle.loads(pickle.dumps(tok))
    assert plain.decode(tok("a photo").input_ids) != tok.decode(tok("a photo").input_ids)


def test_split_special_tokens_survives(clip_dir):
    from transformers import CLIPTokenizerFast as CLIPTokenizer  # the fast class on 4.x; the same class on 5.x

    tok = CLIPTokenizer.from_pretrained(clip_dir, split_special_tokens=True)
    assert tok.backend_tokenizer.encode_special_tokens
    rebuilt = roundtrip(tok)
    assert rebuilt.backend_tokenizer.encode_special_tokens
    assert behaviour(rebuilt) == behaviour(tok)


def test_added_tokens_keep_their_ids(clip_dir):
    from transformers import CLIPTokenizerFast as CLIPTokenizer  # the fast class on 4.x; the same class on 5.x

    tok = CLIPTokenizer.from_pretrained(clip_dir)
    tok.add_tokens(["<extra-a>", "<extra-b>"])
    tok.add_special_tokens({"additional_special_tokens": ["<ctrl>"]})
    rebuilt = roundtrip(tok)
    assert behaviour(rebuilt) == behaviour(tok)
    assert rebuilt.convert_tokens_to_ids(["<extra-a>", "<extra-b>", "<ctrl>"]) == \
        tok.convert_tokens_to_ids(["<extra-a>", "<extra-b>", "<ctrl>"])


@pytest.mark.parametrize("builder", ["llama", "bert", "minilm"])
def test_other_tokenizers_rebuild_exactly(builder, tmp_path):
    from transformers import AutoTokenizer

    folder = tm.minilm_path() if builder == "minilm" else getattr(tm, f"build_{builder}")(tmp_path / builder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert reduce_fast_tokenizer(tok) is not NotImplemented
    assert behaviour(roundtrip(tok)) == behaviour(tok)


@pytest.mark.parametrize("own_merges", ["shared", "different", "absent"])
def test_the_vocab_and_merges_travel_as_one_inner_pickle(clip_dir, own_merges):
    """The vocab and merges are a pickle of their own (read inside the rebuild, so their strings are freed as soon
    as BPE() has copied them); merges equal to the tokenizer's own ``_merges`` are left out of it, and taken from
    the tokenizer's state."""
    from transformers import CLIPTokenizerFast as CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(clip_dir)
    merges = vars(tok).get("_merges")
    if own_merges == "shared":
        if not isinstance(merges, list):  # transformers 4.x's fast CLIP keeps none: give it its backend's list
            listed = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
            vars(tok)["_merges"] = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in listed]
    elif own_merges == "different":
        vars(tok)["_merges"] = [("x", "y")]
    else:
        vars(tok).pop("_merges", None)
    parts = reduce_fast_tokenizer(tok)[1][1]
    assert parts[0] == "bpe-packed"
    vocab, inner_merges = pickle.loads(parts[2])
    assert vocab == tok.backend_tokenizer.get_vocab(with_added_tokens=False)
    if own_merges == "shared":
        assert inner_merges is None and parts[3] is vars(tok)["_merges"]
    else:
        assert isinstance(inner_merges, list) and len(inner_merges) > 200 and parts[3] is None
    rebuilt = roundtrip(tok)
    assert behaviour(rebuilt) == behaviour(tok)
    assert vars(rebuilt).get("_merges") == vars(tok).get("_merges")


def test_an_entry_of_the_earlier_unpacked_form_still_rebuilds(clip_dir):
    """A server started by an earlier Overmind holds entries whose parts carry the vocab and merges themselves."""
    from transformers import CLIPTokenizerFast as CLIPTokenizer

    from overmind_transformers.tokenizer_reduce import _build_backend

    tok = CLIPTokenizer.from_pretrained(clip_dir)
    _, shell, table, shared, params, added = reduce_fast_tokenizer(tok)[1][1]
    vocab, merges = pickle.loads(table)
    backend = _build_backend(("bpe", shell, vocab, merges if merges is not None else shared, params, added))
    assert backend.to_str() == _build_backend(("bpe-packed", shell, table, shared, params, added)).to_str()
    assert backend.to_str() == tok.backend_tokenizer.to_str()
