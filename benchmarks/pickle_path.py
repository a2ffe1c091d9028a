"""CPU time of pickling.dumps / loads: the persistent_id pickler (one Python call per object, strings and ints
included) vs the reducer_override-only pickler (no call for atoms and plain containers).

    .venv/bin/python benchmarks/pickle_path.py [--merges 48800] [--tensors 1800] [--repeat 5]

Objects: a CLIP-sized slow ``CLIPTokenizer`` (49k vocab and merges: dicts of strings and tuples); a
``CLIPTokenizerFast`` of the same files; a module holding ``--tensors`` small parameters. Reducers are the
live adapters' (``hooks.reducers()``), as in a real load. Prints best-of-``--repeat`` process CPU time.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # _support


def cpu_best(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        gc.collect()  # start each run with no pending garbage (runs differ in how much they leave)
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return min(times), out


def many_linears(n):
    """A module holding ``n`` parameters (``n // 2`` Linear layers), of classes the C pickler finds by name."""
    import torch

    return torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(n // 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=48_800)
    ap.add_argument("--tensors", type=int, default=1_800)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import torch
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    from _support import tiny_models
    from overmind.adapters import hooks
    from overmind.entries import pickling

    reducers = hooks.reducers()
    fast_cls = pickling._FastPickler

    def source(where, offset, nbytes):
        return torch.UntypedStorage(nbytes)

    def measure(label, obj):
        out = {}
        for path, cls in (("persistent_id", pickling._CPickler), ("reducer_override", fast_cls)):
            pickling._FastPickler = cls  # _dumps picks the class by this name
            try:
                t_dump, p = cpu_best(lambda: pickling.dumps(obj, reducers), args.repeat)
            finally:
                pickling._FastPickler = fast_cls
            t_load, _ = cpu_best(lambda p=p: pickling.loads(p.skeleton, source, p.pickler), args.repeat)
            assert p.pickler == "pickle", f"{label} went through {p.pickler}"
            out[path] = (t_dump, t_load, len(p.skeleton))
        rows.append((label, out))

    # One object alive at a time: the cyclic GC's full passes scale with every live object, which would
    # otherwise charge the tokenizers' vocabularies to the module's dumps.
    rows: list = []
    measure(f"module, {args.tensors} tensors", many_linears(args.tensors))
    with tempfile.TemporaryDirectory() as d:
        tiny_models.build_clip_tokenizer(d, extra_merges=args.merges)
        measure(f"CLIPTokenizer ({args.merges // 1000}k merges)", CLIPTokenizer.from_pretrained(d))
        measure("CLIPTokenizerFast", CLIPTokenizerFast.from_pretrained(d))

    print(f"{'object':32} {'path':17} {'dumps ms':>9} {'loads ms':>9} {'skeleton KB':>12}")
    for label, out in rows:
        for path, (t_dump, t_load, size) in out.items():
            print(f"{label:32} {path:17} {t_dump * 1e3:9.1f} {t_load * 1e3:9.1f} {size / 1024:12.1f}")
        old, new = out["persistent_id"][0], out["reducer_override"][0]
        print(f"{'':32} {'dumps speed-up':17} {old / new:8.2f}x")


if __name__ == "__main__":
    main()
