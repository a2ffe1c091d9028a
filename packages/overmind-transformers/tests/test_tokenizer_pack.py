"""The fast-tokenizer reducer's packed BPE form: (vocab, merges) as one string of tokens and three int arrays.

A property test packs generated vocabularies (any Unicode, lone surrogates included; "", "\\n", "\\x00", the
separators the packer tries; ids non-contiguous, unordered and past 16 bits; merges repeated, with halves that
are no vocab token) and checks the unpacked dict (its order too) and pairs are exactly the ones packed, after a
real pickle round trip. Then whole tokenizers (a CLIP-sized synthesized one, and the real SD 1.5 tokenizer when
benchmarks/fixtures holds it) go through Overmind's pickler with the live adapters' reducers and must behave,
serialise and hold attributes exactly like the original; the pickle must hold the vocab and merges as a few
objects (CLIP's shared ``_merges`` list included), and tuples the previous version wrote must still rebuild.
"""
from __future__ import annotations

import io
import json
import pickle
import pickletools
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _support import tiny_models as tm
from overmind import hooks, pickling
from overmind_transformers import tokenizer_reduce as tr

SD15_TOKENIZER = Path(__file__).resolve().parents[3] / "benchmarks" / "fixtures" / "full" / "sd15-fp16" / "tokenizer"
TEXTS = ["a photo of the red cat", "<|startoftext|>a photo<|endoftext|> of abq", "  odd   spacing\tand ünïcode ∑",
         "line one\nline two\x00 nul", "", "AN ASTRONAUT riding a horse, 4k, trending on artstation!!!"]

# -------------------------------------------------------------------------------------------- pack / unpack

# Any code point, lone surrogates included (JSON can spell them), and the characters the packer treats specially.
CHARS = st.one_of(st.characters(exclude_categories=()), st.sampled_from(["\n", "\x00", " ", *tr._SEPARATORS]))
TOKENS = st.text(CHARS, max_size=6)


@st.composite
def bpe_models(draw):
    tokens = draw(st.lists(TOKENS, unique=True, max_size=40))
    if draw(st.booleans()):  # every separator in some token: the table is cut by lengths
        tokens = [t for t in tokens if t != "".join(tr._SEPARATORS)] + ["".join(tr._SEPARATORS)]
    ids = draw(st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 300), min_size=len(tokens),
                        max_size=len(tokens), unique=True))
    if draw(st.booleans()):
        ids = list(range(len(tokens)))  # the usual 0, 1, ... in order (the packer's shortcut)
    vocab = dict(zip(tokens, ids))
    half = st.sampled_from(tokens) | TOKENS if tokens else TOKENS  # some halves are no vocab token
    merges = draw(st.lists(st.lists(half, min_size=2, max_size=2), max_size=60))
    merges += draw(st.lists(st.sampled_from(merges), max_size=5)) if merges else []  # repeated merges
    return vocab, merges


def repickled(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


@settings(max_examples=400, deadline=None)
@given(model=bpe_models())
def test_pack_unpack_round_trips_any_vocab_and_merges(model):
    vocab, merges = model
    packed = tr._pack(vocab, merges)
    assert packed is not None
    table, cut, ids, pairs, halves = packed
    assert halves == [h for m in merges for h in m]
    every_char = "".join(vocab) + "".join(halves)
    free = [s for s in tr._SEPARATORS if s not in every_char]
    assert (cut == free[0]) if free else isinstance(cut, array)  # a separator no token holds, or lengths
    got_vocab, got_merges = tr._unpack(*repickled((table, cut, ids, pairs)))
    assert list(got_vocab.items()) == list(vocab.items())  # same pairs, same order
    assert got_merges == [tuple(m) for m in merges]
    assert all(type(m) is tuple for m in got_merges)


@settings(max_examples=200, deadline=None)
@given(model=bpe_models())
def test_the_older_merge_spelling_packs_the_same(model):
    """``"a b"`` strings, the form tokenizers wrote before [a, b] lists: the first half has no space."""
    vocab, merges = model
    merges = [[a.replace(" ", "_"), b] for a, b in merges]
    packed = tr._pack(vocab, [f"{a} {b}" for a, b in merges])
    assert packed is not None
    assert tr._unpack(*packed[:4]) == (vocab, [tuple(m) for m in merges])


@pytest.mark.parametrize("vocab, merges", [
    ({"a": 0, "b": 1}, [["a", "b", "c"]]),  # not a pair
    ({"a": 0, "b": 1}, ["ab"]),  # a string with no space
    ({"a": 0, "b": 1}, [["a", 1]]),  # a half that is no string
    ({"a": 0, "b": 1}, [["a", ["b"]]]),  # an unhashable half
    ({"a": 0, "b": 1}, [("a", "b")]),  # neither JSON form
    ({"a": -1, "b": 1}, [["a", "b"]]),  # an id that is no u32
    ({"a": 0.0, "b": 1}, [["a", "b"]]),
    ({"a": 2**64, "b": 1}, [["a", "b"]]),
])
def test_what_the_packer_does_not_take_it_says(vocab, merges):
    assert tr._pack(vocab, merges) is None


def test_an_odd_model_keeps_the_unpacked_form():
    """Merges the packer does not take (tokenizers writes no such JSON, but an older or other writer might)
    still go through the unpacked ("bpe") form, as before the packed one existed."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    backend = Tokenizer(BPE({"a": 0, "b": 1, "ab": 2, "abab": 3}, [("a", "b"), ("ab", "ab")]))
    assert tr._split_backend(backend, None)[0] == "bpe-packed"
    doc = json.loads(backend.to_str())
    doc["model"]["merges"] = ["a b", ["ab", "ab"]]  # the two spellings mixed

    class Writer:
        def to_str(self):
            return json.dumps(doc)

    parts = tr._split_backend(Writer(), None)
    assert parts[0] == "bpe" and parts[3] == [("a", "b"), ("ab", "ab")]
    assert tr._build_backend(repickled(parts))[0].to_str() == backend.to_str()


def test_added_token_ids_adding_cannot_reproduce_fall_back_to_the_full_json(monkeypatch):
    """An added token whose recorded id adding cannot give back (added, then the model replaced by a larger
    one): the packed form's full-JSON fallback runs and gives what parsing the whole JSON gives."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    backend = Tokenizer(BPE({"a": 0}, [], unk_token="a"))
    backend.add_special_tokens(["<x>"])
    backend.model = BPE({"a": 0, "b": 1, "c": 2, "ab": 3}, [("a", "b")], unk_token="a")  # <x> keeps id 1
    parts = tr._split_backend(backend, None)
    assert parts[0] == "bpe-packed"
    full_jsons = []
    real_dumps = json.dumps
    monkeypatch.setattr(json, "dumps", lambda obj, *a, **k: full_jsons.append(obj) or real_dumps(obj, *a, **k))
    rebuilt, _ = tr._build_backend(repickled(parts))
    monkeypatch.undo()
    assert len(full_jsons) == 1 and full_jsons[0]["model"]["vocab"] == {"a": 0, "b": 1, "c": 2, "ab": 3}
    assert full_jsons[0]["model"]["merges"] == [["a", "b"]]
    assert rebuilt.to_str() == Tokenizer.from_str(backend.to_str()).to_str()


# ------------------------------------------------------------------------------------------ whole tokenizers

def roundtrip(tok):
    def no_storages(where, offset, nbytes):
        raise AssertionError("a tokenizer has no storages")

    pickled = pickling.dumps(tok, hooks.reducers())
    assert pickled.storages == []
    return pickling.loads(pickled.skeleton, no_storages, pickled.pickler), pickled.skeleton


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


def opcodes(skeleton: bytes) -> int:
    return sum(1 for _ in pickletools.genops(skeleton))


def backend_merges(tok) -> list[tuple[str, str]]:
    return [tuple(m) for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]]


@pytest.fixture(scope="module")  # each used by one test
def clip_sized(tmp_path_factory):
    """A CLIP tokenizer with a 49k synthesized vocabulary, as the benchmarks use."""
    from transformers import CLIPTokenizerFast

    return CLIPTokenizerFast.from_pretrained(tm.build_clip_tokenizer(tmp_path_factory.mktemp("clip49k"),
                                                                     extra_merges=48_800))


@pytest.fixture(scope="module")
def sd15():
    if not (SD15_TOKENIZER / "vocab.json").is_file():
        pytest.skip(f"{SD15_TOKENIZER} is not here (benchmarks/fixtures is not in git)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SD15_TOKENIZER, local_files_only=True)  # offline: the folder only


@pytest.mark.parametrize("which", ["clip_sized", "sd15"])
def test_a_full_size_clip_tokenizer_rebuilds_exactly_from_a_few_objects(which, request):
    tok = request.getfixturevalue(which)
    assert len(tok) > 49_000
    tok.add_tokens(["<extra-a>", "photo of"])
    tok.add_special_tokens({"additional_special_tokens": ["<ctrl>"]})
    rebuilt, skeleton = roundtrip(tok)
    assert_same_tokenizer(rebuilt, tok)
    assert rebuilt.convert_tokens_to_ids(["<extra-a>", "photo of", "<ctrl>"]) == \
        tok.convert_tokens_to_ids(["<extra-a>", "photo of", "<ctrl>"])
    # 49k tokens and 48k merges, each an object or three before packing: now a few hundred opcodes in all.
    assert opcodes(skeleton) < 3_000


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
    rebuilt, _ = roundtrip(tok)
    assert_same_tokenizer(rebuilt, tok, clip=False)


@pytest.fixture
def clip_with_merges_list(tmp_path):
    """A CLIP tokenizer holding its merges as ``_merges``, a list of pairs equal to the backend's: what
    transformers 5 keeps (``CLIPTokenizer.__init__``); on 4.x, set as 5 would have it."""
    from transformers import CLIPTokenizerFast

    tok = CLIPTokenizerFast.from_pretrained(tm.build_clip_tokenizer(tmp_path, extra_merges=2_000))
    if not isinstance(vars(tok).get("_merges"), list):
        tok._merges = backend_merges(tok)
    assert tok._merges == backend_merges(tok)
    return tok


def test_the_shared_merges_list_is_pickled_once_and_rebuilt_as_the_list_bpe_got(clip_with_merges_list,
                                                                               monkeypatch):
    import tokenizers.models

    tok = clip_with_merges_list
    _, (_, parts, _, _, _, rest) = tr.reduce_fast_tokenizer(tok)
    assert parts[0] == "bpe-packed" and parts[-1] is True and rest["_merges"] is None
    given_to_bpe = []
    real_bpe = tokenizers.models.BPE

    def recording_bpe(vocab, merges, **params):
        given_to_bpe.append(merges)
        return real_bpe(vocab, merges, **params)

    monkeypatch.setattr(tokenizers.models, "BPE", recording_bpe)
    rebuilt, skeleton = roundtrip(tok)
    monkeypatch.undo()
    assert_same_tokenizer(rebuilt, tok)
    assert rebuilt._merges == tok._merges and all(type(m) is tuple for m in rebuilt._merges)
    assert len(given_to_bpe) == 1 and rebuilt._merges is given_to_bpe[0]  # one list, as before packing
    assert opcodes(skeleton) < 3_000  # 2k merges: not pickled a second time as tuples


def test_merges_held_by_another_attribute_too_keep_their_sharing(clip_with_merges_list):
    tok = clip_with_merges_list
    tok.init_kwargs["merges_copy"] = tok._merges  # the same list object under a second name
    _, (_, parts, _, _, _, rest) = tr.reduce_fast_tokenizer(tok)
    assert parts[-1] is False and rest["_merges"] is tok._merges  # pickled as the list it is
    rebuilt, _ = roundtrip(tok)
    assert_same_tokenizer(rebuilt, tok)
    assert rebuilt.init_kwargs["merges_copy"] is rebuilt._merges


def test_a_merges_list_unlike_the_backends_is_kept_as_it_is(clip_with_merges_list):
    tok = clip_with_merges_list
    tok._merges = [list(m) for m in tok._merges]  # lists, not pairs: not what BPE gets, so not replaced
    _, (_, parts, _, _, _, rest) = tr.reduce_fast_tokenizer(tok)
    assert parts[-1] is False and rest["_merges"] is tok._merges
    rebuilt, _ = roundtrip(tok)
    assert rebuilt._merges == tok._merges and type(rebuilt._merges[0]) is list


def previous_parts(backend, shared_merges):
    """``_split_backend`` as the version before the packed form wrote it (entries in caches still hold it)."""
    doc = json.loads(backend.to_str())
    model = doc["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if isinstance(shared_merges, list) and shared_merges == merges:
        merges = shared_merges
    else:
        same = {k: k for k in vocab}
        merges = [(same.get(m[0], m[0]), same.get(m[1], m[1])) if len(m) == 2 else m for m in merges]
    params = {k: model[k] for k in tr._BPE_PARAMS if k in model}
    added = doc.get("added_tokens") or []
    shell = dict(doc, added_tokens=[], model=dict(model, vocab={}, merges=[]))
    return ("bpe", json.dumps(shell), vocab, merges, params, added)


def test_a_pickle_in_the_previous_form_still_rebuilds(clip_with_merges_list):
    tok = clip_with_merges_list
    tok.add_tokens(["<extra-a>"])
    rebuild, (cls, _, encode_special, wrapped_decode, extras, _) = tr.reduce_fast_tokenizer(tok)
    rest = {k: v for k, v in vars(tok).items() if k != "_tokenizer"}
    parts = previous_parts(tok.backend_tokenizer, rest["_merges"])
    assert parts[3] is tok._merges  # the previous form shared the list through the pickle's memo
    old = (rebuild, (cls, parts, encode_special, wrapped_decode, extras, rest))

    class Previous(pickle.Pickler):
        def reducer_override(self, obj):
            return old if obj is tok else NotImplemented

    buf = io.BytesIO()
    Previous(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(tok)
    rebuilt = pickle.loads(buf.getvalue())
    assert_same_tokenizer(rebuilt, tok)
    assert rebuilt._merges == tok._merges
