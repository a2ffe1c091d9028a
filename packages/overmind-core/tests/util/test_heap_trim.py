"""heap_trim.trim after a large rebuild: glibc gives the freed temporaries back, nothing held changes. A decode
whose skeleton is large trims once; a small one does not (no cost on small loads)."""
from __future__ import annotations

import ctypes

import torch

import overmind
from overmind._util import heap_trim


def _big_vocab():
    return {"vocab": {f"tok{i:06d}": i for i in range(150_000)}, "w": torch.arange(8.0)}


def _small():
    return {"w": torch.arange(8.0)}


def test_trim_runs_on_this_glibc_and_changes_nothing_held():
    kept = [bytearray(4096) for _ in range(100)]
    addresses = [ctypes.addressof((ctypes.c_char * 1).from_buffer(b)) for b in kept]
    assert heap_trim.trim() is True
    assert [ctypes.addressof((ctypes.c_char * 1).from_buffer(b)) for b in kept] == addresses
    assert all(b == bytearray(4096) for b in kept)


def test_a_large_skeleton_trims_once_a_small_one_not(overmind_runtime, monkeypatch):
    calls = []
    real = heap_trim.trim
    monkeypatch.setattr(heap_trim, "trim", lambda: calls.append(1) or real())
    overmind.load(_big_vocab)
    overmind.load(_small)
    published = len(calls)
    big = overmind.load(_big_vocab)  # hits: rebuilt from a skeleton over 1 MiB
    assert len(calls) == published + 1
    assert big["vocab"]["tok149999"] == 149_999 and torch.equal(big["w"], torch.arange(8.0))
    small = overmind.load(_small)
    assert len(calls) == published + 1 and torch.equal(small["w"], torch.arange(8.0))
