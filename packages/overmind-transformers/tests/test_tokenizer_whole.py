"""Whole fast tokenizers through Overmind's pickler with the live adapters' reducers: a CLIP-sized synthesized one
and the real SD 1.5 tokenizer (when benchmarks/fixtures holds it) behave, serialise and hold attributes exactly
like the original; a BPE whose options are null in its JSON (Llama's, many byte-level ones) rebuilds at all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support import tiny_models as tm
from overmind import testing

SD15_TOKENIZER = Path(__file__).resolve().parents[3] / "benchmarks" / "fixtures" / "full" / "sd15-fp16" / "tokenizer"
TEXTS = ["a photo of the red cat", "<|startoftext|>a photo<|endoftext|> of abq", "  odd   spacing\tand ünïcode ∑",
         "line one\nline two\x00 nul", "", "AN ASTRONAUT riding a horse, 4k, trending on artstation!!!"]

# ------------------------------------------------------------------------------------------ whole tokenizers

def roundtrip(tok):
    return testing.roundtrip(tok, storages=False)  # a tokenizer has no storages


def behaviour(tok):
    out = []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        out.append((ids, tok.tokenize(text), tok.decode(ids), tok.decode(ids, skip_special_tokens=True),
                    tok.encode(text, add_special_tokens=False)))
    return out


def assert_same_tokenizer(rebuilt, tok, clip=True):
    assert type(rebuilt) is type(tok)
    assert behaviour(rebuilt) == behaviour(tok)
    assert rebuilt.get_vocab() == tok.get_vocab()
    assert {i: (str(t), t.special) for i, t in rebuilt.added_tokens_decoder.items()} == \
        {i: (str(t), t.special) for i, t in tok.added_tokens_decoder.items()}
    assert rebuilt.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert {k: v for k, v in vars(rebuilt).items() if k != "_tokenizer"} == \
        {k: v for k, v in vars(tok).items() if k != "_tokenizer"}
    if clip:
        assert "</w>" not in rebuilt.decode(rebuilt("a photo").input_ids)  # CLIP's decode override is back


@pytest.fixture(scope="module")  # each used by one test
def clip_sized(tmp_path_factory):
    """A CLIP tokenizer with a 49k synthesized vocabulary, as the benchmarks use."""
    from transformers import CLIPTokenizerFast

    return CLIPTokenizerFast.from_pretrained(tm.build_clip_tokenizer(tmp_path_factory.mktemp("clip49k"),
                                                                     extra_merges=48_800))


@pytest.fixture(scope="module")
def sd15():
    if not (SD15_TOKENIZER / "vocab.json").is_file():
        pytest.skip(f"{SD15_TOKENIZER} is not here (benchmarks/fixtures/make_fixture.py writes it; not in git)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SD15_TOKENIZER, local_files_only=True)  # offline: the folder only


@pytest.mark.parametrize("which", ["clip_sized", "sd15"])
def test_a_full_size_clip_tokenizer_rebuilds_exactly(which, request):
    tok = request.getfixturevalue(which)
    assert len(tok) > 49_000
    tok.add_tokens(["<extra-a>", "photo of"])
    tok.add_special_tokens({"additional_special_tokens": ["<ctrl>"]})
    rebuilt = roundtrip(tok)
    assert_same_tokenizer(rebuilt, tok)
    assert rebuilt.convert_tokens_to_ids(["<extra-a>", "photo of", "<ctrl>"]) == \
        tok.convert_tokens_to_ids(["<extra-a>", "photo of", "<ctrl>"])


def test_a_bpe_with_null_options_rebuilds():
    """``continuing_subword_prefix``, ``end_of_word_suffix`` null in the JSON (a BPE built without them, as
    Llama's and many byte-level ones are): BPE() takes no None for them, the rebuild leaves them out."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(TEXTS)) | set("Ġ<>|/"))
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("a", " "), ("p", "h"), ("ph", "o"), ("t", "h"), ("th", "e")]
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(merges)})
    backend = Tokenizer(BPE(vocab, merges, unk_token="<"))
    backend.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_next")
    backend.decoder = decoders.Fuse()
    model = json.loads(backend.to_str())["model"]
    assert model["continuing_subword_prefix"] is None and model["end_of_word_suffix"] is None
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<", eos_token="|")
    tok.add_tokens(["<extra-a>"])
    rebuilt = roundtrip(tok)
    assert_same_tokenizer(rebuilt, tok, clip=False)
