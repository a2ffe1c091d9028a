"""Rebuild cost of a CLIP-sized fast tokenizer: from its files vs unpickling (default vs the adapter's reducer).

    .venv/bin/python benchmarks/probes/tokenizer_unpickle.py [--merges 48800] [--repeat 7]

Builds a CLIPTokenizer with a synthesized 49k vocabulary (tests/_support/tiny_models.py), then times, best of
``--repeat``: ``CLIPTokenizer.from_pretrained(folder)``; ``pickle.loads`` of a default pickle; ``pickle.loads``
of a pickle made through :func:`overmind_transformers.tokenizer_reduce.reduce_fast_tokenizer` (what a cache hit
does for the tokenizer). Also checks that each rebuilt tokenizer encodes and decodes like the original.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..", "tests")))  # _support


def best(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=48_800)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    from transformers import CLIPTokenizer

    from _support import tiny_models
    from overmind_transformers.tokenizer_reduce import reducers

    table = reducers()

    class Reducing(pickle.Pickler):
        def reducer_override(self, obj):
            for base, fn in table.items():
                if isinstance(obj, base):
                    return fn(obj)
            return NotImplemented

    def dumps_reduced(obj):
        buf = io.BytesIO()
        Reducing(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        return buf.getvalue()

    with tempfile.TemporaryDirectory() as d:
        tiny_models.build_clip_tokenizer(d, extra_merges=args.merges)
        t_files, tok = best(lambda: CLIPTokenizer.from_pretrained(d), args.repeat)
        plain = pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL)
        reduced = dumps_reduced(tok)
        t_plain, tok_plain = best(lambda: pickle.loads(plain), args.repeat)
        t_red, tok_red = best(lambda: pickle.loads(reduced), args.repeat)
        td_plain, _ = best(lambda: pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL), args.repeat)
        td_red, _ = best(lambda: dumps_reduced(tok), args.repeat)

    text = "a photo of the red cat on a blue house"
    ids = tok(text).input_ids

    def same(t):
        return t(text).input_ids == ids and t.decode(ids) == tok.decode(ids)

    print(f"CLIPTokenizer, {len(tok)} tokens, best of {args.repeat}")
    print(f"{'way':34s} {'seconds':>8s} {'pickle MB':>10s} {'dump s':>8s}  same output")
    print(f"{'from_pretrained(folder)':34s} {t_files:8.3f} {'':>10s} {'':>8s}  -")
    print(f"{'pickle.loads, default pickle':34s} {t_plain:8.3f} {len(plain) / 1e6:10.2f} {td_plain:8.3f}  {same(tok_plain)}")
    print(f"{'pickle.loads, overmind reducer':34s} {t_red:8.3f} {len(reduced) / 1e6:10.2f} {td_red:8.3f}  {same(tok_red)}")


if __name__ == "__main__":
    main()
