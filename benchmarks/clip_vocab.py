"""A synthetic CLIP tokenizer folder in the published layout: vocab.json, merges.txt, and the two configs.

The real CLIP vocabulary is byte-level BPE: the 256 byte characters, the same with ``</w>`` (end of word),
then one token per merge in merge order, then ``<|startoftext|>`` and ``<|endoftext|>`` (49,408 tokens from
48,894 merges). The merges here are random but valid: each joins two tokens that already exist, a
``</w>`` token only ever on the right, and each result is new; so the tokenizer loads and tokenizes like the
real one and costs the same to load and to pickle.
"""
from __future__ import annotations

import json
import os
import random

SPECIALS = ("<|startoftext|>", "<|endoftext|>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from byte values to printable characters (the BPE base alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def synthesize(n_merges: int, seed: int = 0) -> tuple[list[str], list[tuple[str, str]]]:
    """Return ``(tokens in id order, merges in rank order)`` for a CLIP-layout vocabulary."""
    rng = random.Random(seed)
    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [c + "</w>" for c in alphabet]
    seen = set(tokens)
    # Mostly lowercase letters, as in the real merges, so tokens grow into word-like pieces.
    letters = [c for c in alphabet if c.isalpha() and c.islower() and c.isascii()]
    inner = list(letters)  # tokens that may stand on the left of a merge (no </w>)
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        left = rng.choice(inner if rng.random() < 0.9 else alphabet)
        if rng.random() < 0.5:
            right = rng.choice(letters) + "</w>"
        else:
            right = rng.choice(inner[-2000:] if rng.random() < 0.3 else letters)
        merged = left + right
        if merged in seen or len(merged.replace("</w>", "")) > 12:
            continue
        seen.add(merged)
        merges.append((left, right))
        tokens.append(merged)
        if not merged.endswith("</w>"):
            inner.append(merged)
    return tokens + list(SPECIALS), merges


def _special(content: str) -> dict:
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False,
            "single_word": False}


def write_tokenizer(folder: str, n_merges: int, seed: int = 0) -> None:
    """Write ``vocab.json``, ``merges.txt``, ``special_tokens_map.json`` and ``tokenizer_config.json``."""
    os.makedirs(folder, exist_ok=True)
    tokens, merges = synthesize(n_merges, seed)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{a} {b}\n" for a, b in merges)
    bos, eos = SPECIALS
    plain = lambda content: {k: v for k, v in _special(content).items() if k != "__type"}  # noqa: E731
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": plain(bos), "eos_token": plain(eos), "pad_token": eos, "unk_token": plain(eos)},
                  f, indent=2)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"add_prefix_space": False, "bos_token": _special(bos), "do_lower_case": True,
                   "eos_token": _special(eos), "errors": "replace", "model_max_length": 77,
                   "name_or_path": "openai/clip-vit-large-patch14", "pad_token": eos,
                   "special_tokens_map_file": "./special_tokens_map.json", "tokenizer_class": "CLIPTokenizer",
                   "unk_token": _special(eos)}, f, indent=2)
