"""A reducer for fast tokenizers: rebuild the Rust backend from its parts, not from pickled Python objects.

Default pickling of a fast tokenizer is slow and lossy. Slow: the backend pickles as its ``to_str()`` JSON and
``Tokenizer.from_str`` deserialises a 49k-token BPE in about 0.2 s, longer than ``from_pretrained`` from the
files. Lossy: two things on the backend are not in that JSON, ``encode_special_tokens`` (set from
``split_special_tokens``) and CLIP's ``decode`` override (``_wrap_decode_method_backend_tokenizer``; without
it ``decode`` leaves ``</w>`` in the text).

This reducer splits a BPE backend into a shell (normalizer, pre-tokenizer, post-processor, decoder, padding,
truncation: the JSON without vocab, merges and added tokens, which parses in microseconds), the vocab dict and
merges list (plain pickle, fast), and the added tokens with their ids. The vocab and merges are pickled on their
own, as one ``bytes`` inside the entry's pickle, and read back inside the rebuild: their ~100k strings and tuples
then live only while ``BPE()`` copies them. Unpickled as part of a pipeline they lived until its whole unpickle
ended (the unpickler's memo holds every object), and the modules allocated meanwhile kept the freed memory
resident: ~3 MiB of empty allocator pools in every process (docs/benchmarks.md, "Memory").
Rebuilding sets ``shell.model = BPE(vocab, merges, ...)`` and adds the added tokens back, then checks that every
added token got its recorded id, and falls back to the full JSON if not. Other model types (WordPiece, Unigram,
WordLevel) keep the JSON.
The tokenizer's own attributes are restored without running ``__init__``. Registered for
``TokenizersBackend`` (``PreTrainedTokenizerFast`` in transformers 4.x), so it covers every fast tokenizer.
"""
from __future__ import annotations

import json
import pickle
from typing import Any

_BPE_PARAMS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
               "byte_fallback", "ignore_merges")
_ADDED_FIELDS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _split_backend_once(backend: Any, shared_merges: Any) -> tuple:
    """:func:`_split_backend`, reused within one load for a backend whose serialised text is the same.

    A pipeline's tokenizer is reduced for its own entry and again inside the pipeline's; the split is a function
    of the text and of ``shared_merges`` alone, so an equal text and an equal ``_merges`` (of the same type) give
    the same parts, except that a split holding the first tokenizer's own ``_merges`` list must hold this one's.
    The memo lasts until no load runs (``overmind.adapter.load_memo``); the parts are only read, by the pickler.
    """
    from overmind.adapter import load_memo

    text = backend.to_str()
    memo = load_memo("overmind_transformers.tokenizer_split")
    last = memo.get("last")
    if last is not None and last[0] == text and type(last[1]) is type(shared_merges) and last[1] == shared_merges:
        parts = last[2]
        if parts[0] == "bpe-packed" and parts[3] is last[1]:
            parts = (*parts[:3], shared_merges, *parts[4:])  # what the split of this tokenizer holds
        return parts
    parts = _split_backend(text, shared_merges)
    memo["last"] = (text, shared_merges, parts)
    return parts


def _split_backend(text: str, shared_merges: Any) -> tuple:
    """``("json", text)`` or ``("bpe-packed", shell_json, table, shared_merges, params, added_tokens)`` for a
    backend's ``to_str()`` text: ``table`` is the pickle of ``(vocab, merges)``, with ``merges`` None where they are
    ``shared_merges``, the tokenizer's own list (pickled once, with the tokenizer)."""
    doc = json.loads(text)
    model = doc.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return ("json", text)
    pairs = all(type(m) is list and len(m) == 2 for m in merges)  # what tokenizers >= 0.20 writes
    if not pairs:
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    shared = isinstance(shared_merges, list) and shared_merges == ([(a, b) for a, b in merges] if pairs else merges)
    if shared:
        merges = shared_merges  # CLIP keeps the same list on the tokenizer: pickle it once, with the tokenizer
    else:
        # The halves of a merge are tokens of the vocab: made the vocab's own string objects, the pickle holds
        # each once (a memo reference in the merges), and a rebuild creates 98k fewer strings (~5 ms for CLIP).
        # One pass over 48k merges, not two (a cold load reduces a CLIP tokenizer once per entry holding it).
        same = {k: k for k in vocab}
        get = same.get
        if pairs:
            merges = [(get(a, a), get(b, b)) for a, b in merges]
        else:
            merges = [(get(m[0], m[0]), get(m[1], m[1])) if len(m) == 2 else m for m in merges]
    params = {k: model[k] for k in _BPE_PARAMS if k in model}
    added = doc.get("added_tokens") or []
    shell = json.dumps(dict(doc, added_tokens=[], model=dict(model, vocab={}, merges=[])))
    table = pickle.dumps((vocab, None if shared else merges), protocol=pickle.HIGHEST_PROTOCOL)
    return ("bpe-packed", shell, table, merges if shared else None, params, added)


def _build_backend(parts: tuple) -> Any:
    from tokenizers import AddedToken, Tokenizer

    if parts[0] == "json":
        return Tokenizer.from_str(parts[1])
    if parts[0] == "bpe-packed":
        _, shell, table, shared_merges, params, added = parts
        vocab, merges = pickle.loads(table)
        if merges is None:
            merges = shared_merges
    else:  # "bpe": an entry written before the packed form (a server started by an earlier Overmind)
        _, shell, vocab, merges, params, added = parts
    from tokenizers.models import BPE

    backend = Tokenizer.from_str(shell)
    # A null in the JSON is the option's default, and BPE() refuses None for its string and bool options
    # (continuing_subword_prefix is null in most byte-level BPEs not built with one): left out, it is the default.
    backend.model = BPE(vocab, merges, **{k: v for k, v in params.items() if v is not None})
    for tok in sorted(added, key=lambda t: t["id"]):
        token = AddedToken(tok["content"], **{k: tok[k] for k in _ADDED_FIELDS if k in tok})
        (backend.add_special_tokens if tok.get("special") else backend.add_tokens)([token])
    got = {i: str(t) for i, t in backend.get_added_tokens_decoder().items()}
    if any(got.get(t["id"]) != t["content"] for t in added):
        # Ids of added tokens are not re-derivable (a gap, or an order the adds cannot reproduce): parse it whole.
        full = json.loads(shell)
        full["model"].update(vocab=vocab, merges=[list(m) for m in merges])
        full["added_tokens"] = added
        return Tokenizer.from_str(json.dumps(full))
    return backend


def reduce_fast_tokenizer(tok: Any):
    """``__reduce__`` tuple for a fast tokenizer, or ``NotImplemented`` (default pickling) for an odd one."""
    state = vars(tok)
    backend = state.get("_tokenizer")
    if backend is None or not hasattr(backend, "to_str"):
        return NotImplemented
    extras = dict(getattr(backend, "__dict__", None) or {})
    wrapped_decode = extras.pop("decode", None) is not None
    if wrapped_decode and not hasattr(type(tok), "_wrap_decode_method_backend_tokenizer"):
        return NotImplemented  # someone else's decode override: we would not know how to put it back
    rest = {k: v for k, v in state.items() if k != "_tokenizer"}
    parts = _split_backend_once(backend, rest.get("_merges"))
    return (rebuild_fast_tokenizer,
            (type(tok), parts, bool(backend.encode_special_tokens), wrapped_decode, extras, rest))


def rebuild_fast_tokenizer(cls: type, parts: tuple, encode_special_tokens: bool, wrapped_decode: bool,
                           backend_extras: dict, state: dict) -> Any:
    """Inverse of :func:`reduce_fast_tokenizer` (named in pickles: keep its module path and signature)."""
    backend = _build_backend(parts)
    backend.encode_special_tokens = encode_special_tokens
    for name, value in backend_extras.items():
        setattr(backend, name, value)
    tok = cls.__new__(cls)
    vars(tok).update(state)
    vars(tok)["_tokenizer"] = backend
    if wrapped_decode:
        tok._wrap_decode_method_backend_tokenizer()
    return tok


def reducers() -> dict[type, Any]:
    """``{fast tokenizer base class: reducer}`` for the installed transformers."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as base
    except ImportError:  # transformers 4.x
        from transformers import PreTrainedTokenizerFast as base
    return {base: reduce_fast_tokenizer}
