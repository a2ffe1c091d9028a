"""A reducer for fast tokenizers: rebuild the Rust backend from its parts, not from pickled Python objects.

Default pickling of a fast tokenizer is slow and lossy. Slow: the backend pickles as its ``to_str()`` JSON and
``Tokenizer.from_str`` deserialises a 49k-token BPE in about 0.2 s, longer than ``from_pretrained`` from the
files. Lossy: two things on the backend are not in that JSON, ``encode_special_tokens`` (set from
``split_special_tokens``) and CLIP's ``decode`` override (``_wrap_decode_method_backend_tokenizer``; without
it ``decode`` leaves ``</w>`` in the text).

This reducer splits a BPE backend into a shell (normalizer, pre-tokenizer, post-processor, decoder, padding,
truncation: the JSON without vocab, merges and added tokens, which parses in microseconds), the vocab and merges
packed into four flat objects (:func:`_pack`: one string holding every token, arrays of ids and of merge
halves), and the added tokens with their ids. For CLIP the skeleton holds ~500 pickle opcodes instead of
~350k and is 35-50 % smaller, and nothing walks 150k strings and tuples at dump time; unpacking (a few
C-level passes, ~12 ms for CLIP) costs about what unpickling the dict and list did, as both make the same
objects, which ``BPE()`` needs (~28 ms, the bulk of a rebuild). Rebuilding sets ``shell.model =
BPE(vocab, merges, ...)`` and adds the added tokens back, then checks that every added token got its recorded
id, and falls back to the full JSON if not. Other model types (WordPiece, Unigram, WordLevel) keep the JSON.
The tokenizer's own attributes are restored without running ``__init__``. Registered for
``TokenizersBackend`` (``PreTrainedTokenizerFast`` in transformers 4.x), so it covers every fast tokenizer.

CLIP on transformers 5 keeps its merges on the tokenizer too (``_merges``, a list of pairs equal to the
backend's). When that list is no other attribute's, the pickle holds it once, packed: ``_merges`` is pickled
as ``None`` and the rebuild sets it to the very list it gave ``BPE``, as a plain pickle's memo would have.

Pickles name :func:`rebuild_fast_tokenizer` and a ``parts`` tuple; both forms written so far rebuild:
``("bpe-packed", ...)`` (this version) and ``("bpe", shell, vocab, merges, params, added)`` (before), as well
as ``("json", text)``.
"""
from __future__ import annotations

import json
from array import array
from itertools import accumulate, chain, count, islice
from typing import Any

_BPE_PARAMS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
               "byte_fallback", "ignore_merges")
_ADDED_FIELDS = ("single_word", "lstrip", "rstrip", "normalized", "special")
# Characters tried as the separator of the packed token table, the first absent from every token wins
# (``str.split`` cuts it, ~2.5 ms for CLIP); if all occur, the table is cut by lengths instead (slices, ~5 ms).
_SEPARATORS = ("\x00", "\x01", "\x1f", "\uffff", "\U0010ffff", "\ufdd0")


def _uint_array(values: list, top: int | None = None) -> array:
    """The narrowest unsigned ``array`` holding ``values``, whose largest is ``top`` if given (TypeError,
    OverflowError where they are no such ints)."""
    top = max(values, default=0) if top is None else top
    return array(next((c for c in "BHI" if top < 1 << 8 * array(c).itemsize), "Q"), values)


def _pack(vocab: dict, merges: list) -> tuple | None:
    """``(table, cut, ids, pairs, halves)`` for a BPE's JSON ``vocab`` and ``merges``, or ``None`` (odd merges).

    ``table`` is one string holding every vocab token, in the vocab's order, then every merge half that is no
    vocab token; ``cut`` says how to cut it: a separator character no token contains, or else an array of
    lengths. ``ids[i]`` is the id of token ``i``, ``pairs[2k]`` and ``pairs[2k + 1]`` the table indices of
    merge ``k``'s halves. ``halves`` (not pickled) is the flat list of merge halves. C-level passes only: no
    Python code runs per token.
    """
    kinds = set(map(type, merges))
    if kinds <= {list}:  # [["a", "b"], ...], what tokenizers writes
        if not set(map(len, merges)) <= {2}:
            return None
        halves = list(chain.from_iterable(merges))
    elif kinds == {str}:  # ["a b", ...], the older form
        halves = list(chain.from_iterable(m.split(" ", 1) for m in merges))
        if len(halves) != 2 * len(merges):
            return None
    else:
        return None
    tokens = list(vocab)
    try:
        values = list(vocab.values())
        ids = _uint_array(values)
        # Ids 0, 1, ... in the vocab's order (the usual case) make the vocab its own token index.
        index = vocab if values == list(range(len(values))) else dict(zip(tokens, count()))
        where = list(map(index.get, halves))
        try:
            pairs = _uint_array(where, len(tokens) - 1)
        except TypeError:  # a None: halves that are no vocab token, more table entries
            extra = dict.fromkeys(h for h, i in zip(halves, where) if i is None)
            index = dict(index)
            index.update(zip(extra, count(len(tokens))))
            tokens += extra
            pairs = _uint_array(list(map(index.get, halves)), len(tokens) - 1)
        for sep in _SEPARATORS:
            table = sep.join(tokens)  # TypeError for a half that is no string
            if table.count(sep) == max(len(tokens) - 1, 0):
                return table, sep, ids, pairs, halves
        return "".join(tokens), _uint_array(list(map(len, tokens))), ids, pairs, halves
    except (TypeError, OverflowError):  # unhashable or non-string halves, ids that are no u32: not ours to pack
        return None


def _unpack(table: str, cut: Any, ids: Any, pairs: Any) -> tuple[dict, list]:
    """``(vocab, merges)`` from :func:`_pack`'s parts: a dict in the packed order and a list of 2-tuples."""
    if isinstance(cut, str):
        tokens = table.split(cut)  # an empty table gives [""]: no id or pair refers to it
    else:
        bounds = list(accumulate(cut, initial=0))
        tokens = [table[i:j] for i, j in zip(bounds, islice(bounds, 1, None))]
    vocab = dict(zip(tokens, ids))  # the first len(ids) tokens are the vocab's
    halves = map(tokens.__getitem__, pairs)
    return vocab, list(zip(halves, halves))


def _is_pairs_of(shared: Any, n: int, halves: list) -> bool:
    """Whether ``shared`` is a list of ``n`` 2-tuples whose items, in order, are ``halves``."""
    return (type(shared) is list and len(shared) == n and set(map(type, shared)) <= {tuple}
            and set(map(len, shared)) <= {2} and list(chain.from_iterable(shared)) == halves)


def _split_backend(backend: Any, shared_merges: Any) -> tuple:
    """``("json", text)``, ``("bpe-packed", shell_json, table, cut, ids, pairs, params, added_tokens,
    merges_shared)`` or, for merges :func:`_pack` does not take, ``("bpe", shell_json, vocab, merges, params,
    added_tokens)`` for ``backend``. ``merges_shared``: ``shared_merges`` equals the merges (as 2-tuples)."""
    text = backend.to_str()
    doc = json.loads(text)
    model = doc.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return ("json", text)
    params = {k: model[k] for k in _BPE_PARAMS if k in model}
    added = doc.get("added_tokens") or []
    shell = json.dumps(dict(doc, added_tokens=[], model=dict(model, vocab={}, merges=[])))
    packed = _pack(vocab, merges)
    if packed is not None:
        table, cut, ids, pairs, halves = packed
        shared = _is_pairs_of(shared_merges, len(merges), halves)
        return ("bpe-packed", shell, table, cut, ids, pairs, params, added, shared)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    if isinstance(shared_merges, list) and shared_merges == merges:
        merges = shared_merges  # CLIP keeps the same list on the tokenizer: pickle it once
    else:
        # The halves of a merge are tokens of the vocab: made the vocab's own string objects, the pickle holds
        # each once (a memo reference in the merges), and a rebuild creates 98k fewer strings (~5 ms for CLIP).
        same = {k: k for k in vocab}
        merges = [(same.get(m[0], m[0]), same.get(m[1], m[1])) if len(m) == 2 else m for m in merges]
    return ("bpe", shell, vocab, merges, params, added)


def _build_backend(parts: tuple) -> tuple[Any, list | None]:
    """The backend for ``parts``, and the merges list to set as the tokenizer's ``_merges`` (or ``None``)."""
    from tokenizers import AddedToken, Tokenizer

    if parts[0] == "json":
        return Tokenizer.from_str(parts[1]), None
    if parts[0] == "bpe-packed":
        _, shell, table, cut, ids, pairs, params, added, shared = parts
        vocab, merges = _unpack(table, cut, ids, pairs)
    else:  # "bpe", written before the packed form
        _, shell, vocab, merges, params, added = parts
        shared = False
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
        backend = Tokenizer.from_str(json.dumps(full))
    return backend, (merges if shared else None)


def _referenced_elsewhere(obj: Any, state: dict, name: str) -> bool:
    """Whether ``obj`` is an attribute of ``state`` other than ``name``, or a value of one that is a dict."""
    return any(v is obj or (type(v) is dict and any(w is obj for w in v.values()))
               for k, v in state.items() if k != name)


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
    shared = rest.get("_merges")
    parts = _split_backend(backend, shared)
    if parts[0] == "bpe-packed" and parts[-1]:
        if _referenced_elsewhere(shared, rest, "_merges"):
            parts = parts[:-1] + (False,)  # another attribute holds the list too: pickled as it is, shared
        else:
            rest["_merges"] = None  # the packed merges stand for it: the rebuild puts them back here
    return (rebuild_fast_tokenizer,
            (type(tok), parts, bool(backend.encode_special_tokens), wrapped_decode, extras, rest))


def rebuild_fast_tokenizer(cls: type, parts: tuple, encode_special_tokens: bool, wrapped_decode: bool,
                           backend_extras: dict, state: dict) -> Any:
    """Inverse of :func:`reduce_fast_tokenizer` (named in pickles: keep its module path and signature)."""
    backend, merges = _build_backend(parts)
    backend.encode_special_tokens = encode_special_tokens
    for name, value in backend_extras.items():
        setattr(backend, name, value)
    tok = cls.__new__(cls)
    vars(tok).update(state)
    if merges is not None:
        vars(tok)["_merges"] = merges  # the list BPE got, as the shared list was before packing
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
