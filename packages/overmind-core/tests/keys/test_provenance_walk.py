"""The compiled provenance walk (``csrc/provenance_walk.cpp``) against the Python ``provenance._walk``.

A snapshot's module and tensor lists are built in C where ``overmind.native._C`` is. Generated module trees (nesting,
a module shared between places, cycles, ``None`` children and parameters, buffers, tensor attributes of plain and
subclassed tensors, ``OrderedDict`` containers reordered with ``move_to_end``, hooks, ``training`` flags, views
with odd strides and offsets, conjugate and negative views, gradients, meta tensors, empty storages) are walked
both ways, with no mode and inside a torch-function mode: the two results must be equal item for item, with the
same types, and an odd module must raise the same error both ways.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support.module_trees import trees
from overmind.keys import provenance


@pytest.fixture(scope="module")
def walk(compiled_function):
    provenance_walk = compiled_function("provenance_walk")

    def compiled(module):
        return provenance_walk(module, torch.Tensor, torch.nn.Parameter, provenance._not_tensor_types,
                               provenance._loose_tensors, provenance._tensor_row)
    return compiled


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
