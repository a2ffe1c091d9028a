"""The compiled provenance walk (``csrc/provenance_walk.cpp``) against the Python ``provenance._walk``.

A snapshot's module and tensor lists are built in C where ``overmind.native._C`` is. Generated module trees (nesting,
a module shared between places, cycles, ``None`` children and parameters, buffers, tensor attributes of plain and
subclassed tensors, ``OrderedDict`` containers reordered with ``move_to_end``, hooks, ``training`` flags, views
with odd strides and offsets, conjugate and negative views, gradients, meta tensors, empty storages) are walked
both ways, with no mode and inside a torch-function mode: the two results must be equal item for item, with the
same types, and an odd module must raise the same error both ways.
"""
from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overmind.keys import provenance


@pytest.fixture(scope="module")
def walk(compiled_function):
    provenance_walk = compiled_function("provenance_walk")

    def compiled(module):
        return provenance_walk(module, torch.Tensor, torch.nn.Parameter, provenance._not_tensor_types,
                               provenance._loose_tensors, provenance._tensor_row)
    return compiled


class Sub(torch.Tensor):
    pass


class Plain:
    pass


def _tensor(draw, kind: str) -> torch.Tensor:
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.complex64, torch.int64]))
    n = draw(st.integers(0, 12))
    base = torch.zeros(n + 4, dtype=dtype)
    view = draw(st.sampled_from(["whole", "offset", "strided", "conj", "neg", "meta", "empty"]))
    if view == "offset":
        t = base[draw(st.integers(0, 3)):]
    elif view == "strided":
        t = base.as_strided((max(1, n // 2), 2), (2, 1), draw(st.integers(0, 1)))
    elif view == "conj" and dtype.is_complex:
        t = base.conj()
    elif view == "neg" and dtype.is_complex:
        t = base.conj()._neg_view() if hasattr(base, "_neg_view") else base
    elif view == "meta":
        t = torch.empty(n, dtype=dtype, device="meta")
    elif view == "empty":
        t = torch.empty(0, dtype=dtype)
    else:
        t = base
    if kind == "parameter":
        p = torch.nn.Parameter(t.detach().clone() if t.is_neg() or t.is_conj() else t.detach(),
                               requires_grad=dtype.is_floating_point and draw(st.booleans()))
        if p.requires_grad and draw(st.booleans()):
            p.grad = torch.zeros_like(p)
        return p
    if kind == "subclass":
        return t.as_subclass(Sub)
    return t


@st.composite
def trees(draw):
    """A module tree with every kind of content the walk reads, and sometimes a shared child or a cycle."""
    made: list[torch.nn.Module] = []

    def module(depth: int) -> torch.nn.Module:
        m = torch.nn.Module()
        made.append(m)
        if draw(st.booleans()):
            m._parameters = collections.OrderedDict()
        for i in range(draw(st.integers(0, 3))):
            m._parameters[f"p{i}"] = None if draw(st.integers(0, 5)) == 0 else _tensor(draw, "parameter")
        for i in range(draw(st.integers(0, 2))):
            m._buffers[f"b{i}"] = None if draw(st.integers(0, 5)) == 0 else _tensor(draw, "plain")
        for i in range(draw(st.integers(0, 2))):
            setattr(m, f"a{i}", draw(st.sampled_from([1, "x", None, 2.5, (1, 2), Plain()])))
        if draw(st.integers(0, 3)) == 0:
            object.__setattr__(m, "loose", _tensor(draw, draw(st.sampled_from(["plain", "subclass"]))))
        m.training = draw(st.booleans())
        for _ in range(draw(st.integers(0, 2))):
            m.register_forward_hook(lambda *a: None)
        if draw(st.booleans()):
            m.register_forward_pre_hook(lambda *a: None)
        if depth < 3:
            for i in range(draw(st.integers(0, 3))):
                choice = draw(st.integers(0, 9))
                if choice == 0:
                    m._modules[f"c{i}"] = None
                elif choice == 1 and made:
                    m._modules[f"c{i}"] = draw(st.sampled_from(made))  # shared, or a cycle back up
                else:
                    m._modules[f"c{i}"] = module(depth + 1)
        if isinstance(m._parameters, collections.OrderedDict) and len(m._parameters) > 1 and draw(st.booleans()):
            m._parameters.move_to_end(next(iter(m._parameters)))  # its own order is not its dict's order
        return m

    return module(0)


def _same(a, b) -> None:
    assert a == b
    for rows_a, rows_b in zip(a, b):
        assert len(rows_a) == len(rows_b)
        for x, y in zip(rows_a, rows_b):
            assert [type(v) for v in x] == [type(v) for v in y]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), under_mode=st.booleans())
def test_the_compiled_walk_builds_what_python_builds(walk, tree, under_mode):
    if under_mode:
        with torch.device("meta"):  # a torch-function mode: every row from the Python function
            _same(walk(tree), provenance._walk(tree, torch.Tensor))
    else:
        _same(walk(tree), provenance._walk(tree, torch.Tensor))


def test_a_real_model_walks_the_same(walk):
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2).half())
    m[1].extra = torch.ones(2)
    _same(walk(m), provenance._walk(m, torch.Tensor))


def test_a_module_without_its_dicts_raises_the_same_both_ways(walk):
    m = torch.nn.Linear(2, 2)
    del m.__dict__["_buffers"]
    with pytest.raises(KeyError) as compiled:
        walk(m)
    with pytest.raises(KeyError) as python:
        provenance._walk(m, torch.Tensor)
    assert compiled.value.args == python.value.args


def test_a_storage_resized_to_nothing_walks_the_same(walk):
    m = torch.nn.Linear(2, 2)
    m.weight.untyped_storage().resize_(0)  # the view now lies beyond its storage's bytes
    _same(walk(m), provenance._walk(m, torch.Tensor))


def test_snapshot_uses_the_compiled_walk_when_selected(walk, impl):
    from overmind.native import zerocopy

    assert (zerocopy.provenance_walk() is not None) == (impl == "c")
