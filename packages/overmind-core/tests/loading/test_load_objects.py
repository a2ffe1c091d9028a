"""What comes back: every dtype, layout details, tensor types, shared views, nested loads, and objects from
earlier loads passed as arguments (referenced, not copied)."""
from __future__ import annotations

import warnings

import pytest
import torch

import overmind
from overmind.client import connection as client_mod
from overmind.client.connection import get_client
from overmind.testing import overmind_mapped, run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

ALL_DTYPES = [d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
    getattr(torch, "uint16", None), getattr(torch, "uint32", None), getattr(torch, "uint64", None),
    getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None),
    getattr(torch, "float8_e4m3fnuz", None), getattr(torch, "float8_e5m2fnuz", None),
    getattr(torch, "float8_e8m0fnu", None),
) if d is not None]


class TaggedTensor(torch.Tensor):
    """A picklable tensor subclass."""


def make_tensors():
    g = torch.Generator().manual_seed(0)
    out = {}
    for d in ALL_DTYPES:
        raw = torch.randint(0, 255, (3, 5), generator=g, dtype=torch.uint8)
        out[str(d)] = raw.view(torch.uint8).repeat(1, torch.empty(0, dtype=d).element_size()).view(d)
    base = torch.arange(60, dtype=torch.float32)
    out["base"] = base
    out["view_t"] = base.view(6, 10).t()  # non-contiguous strides over the same storage
    out["view_off"] = base[7:19].view(3, 4)  # storage offset
    out["param"] = torch.nn.Parameter(torch.randn(4, 4, generator=g))
    out["frozen"] = torch.nn.Parameter(torch.randn(2, generator=g), requires_grad=False)
    out["grad_leaf"] = torch.randn(3, generator=g).requires_grad_()
    out["tagged"] = torch.arange(5.0).as_subclass(TaggedTensor)
    out["empty"] = torch.empty(0, 3)
    return out


def make_meta_tensors():
    """Meta tensors, as a load under a meta default device makes them (a result holding meta tensors is published
    only where the key says the call was made to produce them: torch_state.makes_meta)."""
    base = torch.empty(4, 6)
    return {"base": base, "view_t": base.t(), "param": torch.nn.Parameter(torch.empty(2, 3))}


def test_meta_tensors_round_trip_where_the_call_asked_for_them(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    with torch.device("meta"):
        expected = make_meta_tensors()
        results = [overmind.load(make_meta_tensors), overmind.load(make_meta_tensors)]
    assert [e["hits"] for e in get_client().ls()] == [1]
    for result in results:
        for name, e in expected.items():
            g = result[name]
            assert (type(g), g.dtype, g.shape, g.stride(), g.storage_offset(), g.requires_grad, g.device) == \
                   (type(e), e.dtype, e.shape, e.stride(), e.storage_offset(), e.requires_grad, e.device), name


def test_every_dtype_layout_and_type_round_trips(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    expected = make_tensors()
    got = overmind.load(make_tensors)
    got2 = overmind.load(make_tensors)  # a hit: rebuilt from the entry only
    for result in (got, got2):
        assert set(result) == set(expected)
        for name, e in expected.items():
            g = result[name]
            assert type(g) is type(e), name
            assert (g.dtype, g.shape, g.stride(), g.storage_offset(), g.requires_grad, g.device) == \
                   (e.dtype, e.shape, e.stride(), e.storage_offset(), e.requires_grad, e.device), name
            if e.device.type != "meta" and e.numel():
                assert torch.equal(g.detach().contiguous().view(torch.uint8), e.detach().contiguous().view(torch.uint8)), name
                assert overmind_mapped(g.data_ptr()), name
        # views that shared one storage still share one storage
        base_ptr = result["base"].untyped_storage().data_ptr()
        assert result["view_t"].untyped_storage().data_ptr() == base_ptr
        assert result["view_off"].untyped_storage().data_ptr() == base_ptr
        result["base"][8] = -1.0
        assert result["view_off"][0, 1] == -1.0
    assert got2["base"][8] == 7.0 or got["base"][8] == -1.0  # each load is independent


def make_part(n: int):
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(n)
        return torch.nn.Linear(n, n)


def make_whole(n: int):
    # a loader that loads its components through the cache, as a pipeline does
    return torch.nn.ModuleDict({"a": overmind.load(make_part, n), "b": overmind.load(make_part, n + 1)})


def test_nested_loads_store_shared_weights_once(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    whole = overmind.load(make_whole, 64)
    entries = {e["meta"]["loader"].rsplit(".", 1)[-1]: e for e in client_mod.get_client().ls()}
    assert set(entries) == {"make_part", "make_whole"} or len(entries) == 3
    outer = [e for e in client_mod.get_client().ls() if e["meta"]["loader"].endswith("make_whole")][0]
    assert len(outer["deps"]) == 2
    parts_bytes = sum(e["nbytes"] for e in client_mod.get_client().ls() if e["meta"]["loader"].endswith("make_part"))
    assert outer["nbytes"] < 64 * 64 * 4, "the outer entry must reference its parts' weights, not copy them"
    assert parts_bytes >= (64 * 64 + 65 * 65) * 4
    again = run_fresh('''
import torch, overmind
from overmind.testing import report, overmind_mapped
import sys
sys.path.insert(0, %r)
from test_load_objects import make_whole
w = overmind.load(make_whole, 64)
report([float(w["a"].weight.sum()), overmind_mapped(w["b"].weight.data_ptr())])
''' % __import__("os").path.dirname(__file__), env={"OVERMIND_STRICT": "1"})
    assert again == [pytest.approx(float(whole["a"].weight.sum())), True]


def combine(first, second, scale: float = 1.0):
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(2)
        head = torch.nn.Linear(2, 2)
    return torch.nn.ModuleDict({"first": first, "second": second, "head": head})


def test_objects_from_earlier_loads_are_referenced_and_keyed_by_entry(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    a = overmind.load(make_part, 96)
    b = overmind.load(make_part, 97)
    combo = overmind.load(combine, a, b)
    c = client_mod.get_client()
    outer = [e for e in c.ls() if e["meta"]["loader"].endswith("combine")][0]
    # The arguments are the result's own objects (as in the plain call), so the entry holds none of their bytes.
    assert outer["deps"] == [] and outer["nbytes"] < 96 * 96 * 4
    assert combo["first"] is a and combo["second"] is b
    # the same arguments again: a hit, keyed by the entries a and b came from
    combo2 = overmind.load(combine, a, b)
    assert len([e for e in c.ls() if e["meta"]["loader"].endswith("combine")]) == 1
    assert torch.equal(combo2["head"].weight, combo["head"].weight)
    # modify a in place: it no longer holds its entry's bytes, so it has no key: a plain call
    with torch.no_grad():
        a.weight.add_(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        combo3 = overmind.load(combine, a, b)
    assert combo3["first"] is a


def make_unusual_tensors():
    c = torch.complex(torch.arange(4.0), torch.ones(4))
    p = torch.nn.Parameter(torch.ones(3))
    p.tag = "kept"  # Python attributes on a parameter (transformers sets some) survive
    return {"conj": c.conj(), "neg": c.conj().imag, "param": p, "plain": torch.arange(6).view(2, 3)}


def test_plain_tensors_take_the_fast_reduce_and_unusual_ones_torchs(overmind_runtime, monkeypatch):
    from overmind.native import tensors

    monkeypatch.setenv("OVERMIND_STRICT", "1")
    expected = make_unusual_tensors()
    assert tensors.reduce_tensor(expected["conj"]) is NotImplemented
    assert tensors.reduce_tensor(expected["plain"])[0] is tensors.rebuild_from_untyped
    overmind.load(make_unusual_tensors)
    got = overmind.load(make_unusual_tensors)
    assert got["conj"].is_conj() and torch.equal(got["conj"].resolve_conj(), expected["conj"].resolve_conj())
    assert torch.equal(got["neg"], expected["neg"])
    assert type(got["param"]) is torch.nn.Parameter and got["param"].tag == "kept"
    assert torch.equal(got["plain"], expected["plain"]) and overmind_mapped(got["plain"].data_ptr())


def make_versioned_tensors():
    fresh = torch.nn.Parameter(torch.ones(4))  # version 0, as a safetensors load leaves its parameters
    edited = torch.zeros(3)
    for _ in range(3):
        edited.add_(1)  # version 3
    return {"fresh": fresh, "edited": edited, "view": edited[1:]}


def test_version_counters_are_the_plain_calls(overmind_runtime, monkeypatch):
    """A rebuild over a storage bumps a tensor's version counter (``set_``); the plain call's counter is set again,
    on a miss and on a hit alike (``_version`` is what autograd compares to catch an in-place change)."""
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    expected = make_versioned_tensors()
    for result in (overmind.load(make_versioned_tensors), overmind.load(make_versioned_tensors)):
        for name in ("fresh", "edited", "view"):
            assert result[name]._version == expected[name]._version, name


def make_inference_tensors():
    """A loader that enters inference mode itself (as some checkpoint converters do)."""
    with torch.inference_mode():
        layer = torch.nn.Linear(3, 2, device="meta").to_empty(device="cpu")  # no draw from the global generator
        layer.weight.copy_(torch.arange(6.0).view(2, 3))
        layer.bias.zero_()
        return {"layer": layer, "tensor": torch.arange(4.0), "cloned": torch.ones(2).clone()}


def test_inference_tensors_of_a_loader_are_inference_tensors_on_a_miss_and_a_hit(overmind_runtime, monkeypatch):
    """Outside inference mode the caller's key is the normal one; the loader's tensors are inference tensors all the
    same, and a rebuild must not make them normal ones (``w.add_(1)`` outside inference mode must fail as plain)."""
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    expected = make_inference_tensors()
    for result in (overmind.load(make_inference_tensors), overmind.load(make_inference_tensors)):
        pairs = [(result["tensor"], expected["tensor"]), (result["cloned"], expected["cloned"]),
                 *zip(result["layer"].parameters(), expected["layer"].parameters())]
        for got, want in pairs:
            assert (type(got), got.is_inference(), got.requires_grad) == (type(want), True, want.requires_grad)
            assert torch.equal(got, want) and overmind_mapped(got.data_ptr())
        with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
            result["tensor"].add_(1)
