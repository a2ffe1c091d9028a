"""A storage copied into an entry keeps the plain storage's address modulo 64 (``shm/placer.py``).

CPU kernels round differently on differently aligned data: a plain safetensors load gives views aligned only to
their element size, and a copy placed 64-byte aligned computed other last bits than the plain object (a UNet's
output moved by 7e-9). Hypothesis generates tensors at every skew from a page-aligned anonymous mapping (never a
file, so they are copied, not referenced), in several dtypes, and checks that the cached object, on the
publishing call and on a hit, lies at the plain skew, holds the plain bytes, and computes bitwise the plain result.
"""
from __future__ import annotations

import mmap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind.shm.layout import STORAGE_ALIGN
from overmind.testing import overmind_mapped

SLOT = 1 << 17  # room for the largest tensor (96 x 96 float64) plus its skew
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def skewed_tensors(skews: tuple[int, ...], dtype_name: str, seed: int) -> list[torch.Tensor]:
    """One tensor per skew, each a view of a fresh anonymous mapping (page aligned, private: copied into the entry,
    never a file reference) starting ``skew`` bytes past a 128 KiB boundary."""
    dtype = DTYPES[dtype_name]
    arena = mmap.mmap(-1, SLOT * len(skews))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, skew in enumerate(skews):
        count = 96 * 96
        t = torch.frombuffer(arena, dtype=dtype, count=count, offset=i * SLOT + skew).view(96, 96)
        t.copy_(torch.randn(96, 96, generator=gen).to(dtype))
        out.append(t)
    return out


def model(skews: tuple[int, ...], dtype_name: str, seed: int) -> torch.nn.ModuleList:
    """Linear layers whose weights are the skewed tensors (as a lazy mmap load leaves them)."""
    layers = torch.nn.ModuleList()
    for t in skewed_tensors(skews, dtype_name, seed):
        layer = torch.nn.Linear(96, 96, bias=False, dtype=t.dtype, device="meta")  # no draw: it would not be cached
        layer.weight = torch.nn.Parameter(t, requires_grad=False)
        layers.append(layer)
    return layers


@pytest.fixture(scope="module")
def runtime():
    from overmind.testing import isolated_runtime

    with isolated_runtime() as path:
        yield path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(skews=st.lists(st.integers(0, 63), min_size=1, max_size=4).map(tuple),
       dtype_name=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**16))
def test_copied_storages_keep_the_plain_skew_and_compute_the_plain_bits(runtime, skews, dtype_name, seed):
    item = DTYPES[dtype_name].itemsize
    skews = tuple(s - s % item for s in skews)  # a view starts on an element boundary
    x = torch.randn(7, 96, generator=torch.Generator().manual_seed(seed + 1)).to(DTYPES[dtype_name])
    plain = model(skews, dtype_name, seed)
    expected = [(m.weight.data_ptr() % STORAGE_ALIGN, m.weight.detach().clone(), m(x)) for m in plain]
    for attempt in ("publish", "hit"):
        got = overmind.load(model, skews, dtype_name, seed)
        for layer, (skew, weight, y) in zip(got, expected):
            w = layer.weight
            assert overmind_mapped(w.data_ptr()), f"{attempt}: the weight does not come from the cache"
            assert w.data_ptr() % STORAGE_ALIGN == skew, f"{attempt}: copied at another alignment"
            assert w.dtype == weight.dtype and torch.equal(w, weight)
            out = layer(x)
            assert torch.equal(out.view(torch.uint8), y.view(torch.uint8)), f"{attempt}: other bits than plain"
