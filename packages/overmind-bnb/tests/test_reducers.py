"""Reducers for Params4bit / Int8Params: type, quantization state and identity survive, bytes are not copied.

Round trips use Overmind's own pickler and a sealed memfd, as a hit does (``Roundtrip``), and, once, the standard
library's pickle, so the reducers are proven before any server is involved.
"""
from __future__ import annotations

import pickle

import pytest
import torch
from bitsandbytes.nn import Int8Params, Linear4bit, Linear8bitLt, Params4bit
from torch import nn

from overmind_bnb.reducers import _reduce_if_quantized, reduce_quantized_param, reducer_table
from overmind_bnb_testlib import Roundtrip, plain_roundtrip


class UserNet(nn.Module):
    """A user's own module mixing bare bitsandbytes layers with a plain one (the weights are quantized on .to)."""

    def __init__(self, quant_type: str = "nf4", compress_statistics: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.fc4 = Linear4bit(64, 128, compute_dtype=torch.float32, quant_type=quant_type,
                              compress_statistics=compress_statistics)
        self.fc8 = Linear8bitLt(128, 64, has_fp16_weights=False)
        self.head = nn.Linear(64, 32)

    def forward(self, x):
        return self.head(torch.relu(self.fc8(torch.relu(self.fc4(x)))))


def quantized_net(**kw) -> UserNet:
    return UserNet(**kw).to("cpu")  # bitsandbytes quantizes on the first .to(device)


def quant_state_fields(qs) -> dict:
    """Every QuantState field, tensors as tensors, the nested state flattened in."""
    out = {k: v for k, v in vars(qs).items() if k != "state2"}
    if getattr(qs, "state2", None) is not None:
        out.update({f"state2.{k}": v for k, v in vars(qs.state2).items()})
    return out


def assert_same_fields(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype, k
        else:
            assert a[k] == b[k], k


X = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("quant_type,nested", [("nf4", True), ("fp4", False)])
def test_linear4bit_keeps_type_state_identity_and_output(quant_type, nested):
    net = quantized_net(quant_type=quant_type, compress_statistics=nested)
    w = net.fc4.weight
    assert w.bnb_quantized and (w.quant_state.state2 is not None) == nested
    rt = Roundtrip(net)
    copy = rt.obj
    cw = copy.fc4.weight

    assert type(cw) is Params4bit and type(copy.fc4) is Linear4bit
    assert torch.equal(cw.data, w.data) and cw.dtype == torch.uint8 and not cw.requires_grad
    assert_same_fields(quant_state_fields(cw.quant_state), quant_state_fields(w.quant_state))
    for attr in ("blocksize", "compress_statistics", "quant_type", "quant_storage", "bnb_quantized"):
        assert getattr(cw, attr) == getattr(w, attr), attr
    # The cycles bitsandbytes relies on are one object each, not copies.
    assert cw.module is copy.fc4 and copy.fc4.quant_state is cw.quant_state
    # Zero-copy: the packed weight and its statistics are views of the entry's mapping.
    assert rt.in_buffer(cw) and rt.in_buffer(cw.quant_state.absmax) and rt.in_buffer(cw.quant_state.code)
    with torch.no_grad():
        assert torch.equal(copy(X), net(X))
    assert torch.equal(copy(X), net(X))  # with autograd on, bitsandbytes takes its other CPU path


def test_int8params_keep_cb_scb_and_output():
    net = quantized_net()
    w = net.fc8.weight
    rt = Roundtrip(net)
    cw = rt.obj.fc8.weight
    assert type(cw) is Int8Params and cw.dtype == torch.int8 and not cw.has_fp16_weights
    assert torch.equal(cw.data, w.data) and torch.equal(cw.SCB, w.SCB)
    # CB and the parameter are one storage, as bitsandbytes made them, and it lies in the entry's mapping.
    assert cw.CB.data_ptr() == cw.data_ptr() and rt.in_buffer(cw) and rt.in_buffer(cw.SCB)
    with torch.no_grad():
        assert torch.equal(rt.obj(X), net(X))


def test_roundtrip_after_forward_keeps_cpu_repacked_state():
    """After a forward, bitsandbytes may repack 4-bit weights for its CPU kernel and move 8-bit CB/SCB into
    Linear8bitLt.state; a model cached in that state must still round-trip."""
    net = quantized_net()
    with torch.no_grad():
        expected = net(X)
    rt = Roundtrip(net)
    assert_same_fields(quant_state_fields(rt.obj.fc4.weight.quant_state), quant_state_fields(net.fc4.weight.quant_state))
    assert net.fc8.weight.CB is None and rt.obj.fc8.weight.CB is None
    assert torch.equal(rt.obj.fc8.state.SCB, net.fc8.state.SCB)
    with torch.no_grad():
        assert torch.equal(rt.obj(X), expected)


def test_lone_parameter_with_its_module_cycle():
    """Pickling the parameter first (its state names the module, whose state names the parameter)."""
    net = quantized_net()
    w, m = Roundtrip([net.fc4.weight, net.fc4]).obj
    assert type(w) is Params4bit and w.module is m and m.weight is w


def test_requires_grad_and_fp16_int8_weights_survive():
    p = Int8Params(torch.randn(8, 8, dtype=torch.float16), requires_grad=True, has_fp16_weights=True)
    c = Roundtrip(p).obj
    assert type(c) is Int8Params and c.requires_grad and c.has_fp16_weights and torch.equal(c, p)


def test_standard_pickle_with_the_reducers():
    net = quantized_net()
    copy = plain_roundtrip(net)
    assert type(copy.fc4.weight) is Params4bit and type(copy.fc8.weight) is Int8Params
    with torch.no_grad():
        assert torch.equal(copy(X), net(X))


def test_without_the_reducers_the_type_is_lost():
    """Why the adapter exists: torch's own reduce turns a Params4bit into a plain Parameter."""
    net = quantized_net()
    copy = pickle.loads(pickle.dumps(net))
    assert type(copy.fc4.weight) is nn.Parameter


def test_reducer_table_names_the_types_or_defers():
    assert reducer_table() == {Params4bit: reduce_quantized_param, Int8Params: reduce_quantized_param}
    net = quantized_net()
    assert _reduce_if_quantized(net.fc4.weight)[0] is reduce_quantized_param(net.fc4.weight)[0]
    assert _reduce_if_quantized(net.head.weight) is NotImplemented
