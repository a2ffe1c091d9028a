"""What a provenance record keeps of a snapshot is equal for two snapshots exactly when the snapshots are equal.

``origin_of`` compares a fresh snapshot against the one taken at the rebuild; the record keeps a compact form of
it (``provenance._kept``: one marshal string, types, dtypes and devices as numbers). A compact form that called
two different snapshots equal would key a changed module as its entry: the wrong object. Hypothesis builds pairs
of snapshot bodies, the second an edit of the first or the same, with the values that are easy to confuse (two
classes of one name, ``1``, ``1.0`` and ``True``, a list and a tuple, equal devices made twice, shapes as
``torch.Size`` and tuples), and checks that the compact forms are equal exactly when the snapshots hold equal
values of the same types: never where ``==`` on the snapshots says they differ.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind.keys import provenance


def _same_name_class():
    class Linear(torch.nn.Module):  # named as torch.nn.Linear, another class
        pass
    return Linear


class Meta(type):
    __hash__ = None  # an unhashable metaclass: a snapshot holding its class is kept whole

    def __eq__(cls, other):
        return cls is other


class OddModule(torch.nn.Module, metaclass=type("OddMeta", (Meta, type(torch.nn.Module)), {})):
    pass


TYPES = [torch.nn.Linear, _same_name_class(), torch.nn.ReLU, torch.Tensor, torch.nn.Parameter]
DTYPES = [torch.float16, torch.float32, torch.bfloat16]
values = st.sampled_from([0, 1, 1.0, True, False, -1, 2**47 + 3, None, "w", "weight"])
shapes = st.lists(st.integers(0, 4), max_size=3).flatmap(
    lambda dims: st.sampled_from([torch.Size(dims), tuple(dims)]))
devices = st.sampled_from(["cpu", "meta", "cuda:0"]).map(torch.device)  # a new (equal) object each time
names = st.lists(st.sampled_from(["0", "1", "conv", "weight"]), max_size=3, unique=True).map(tuple)
strides = st.lists(st.integers(0, 4), max_size=3).map(tuple)  # Tensor.stride() gives a tuple
rows = st.tuples(st.sampled_from(TYPES), st.integers(0, 2**48), st.integers(0, 2**20), st.sampled_from(DTYPES),
                 shapes, strides, values, st.booleans(), st.booleans(), st.booleans(), devices)
named = st.lists(st.tuples(st.sampled_from(["weight", "bias"]), st.integers(0, 2**48), values), max_size=2)
row_lists = st.one_of(st.just(()), named, named.map(tuple))
modules = st.tuples(st.sampled_from(TYPES), st.booleans(), names, st.lists(st.integers(0, 2**48), max_size=3)
                    .map(tuple), st.integers(0, 2), values, row_lists, row_lists, row_lists)
bodies = st.tuples(st.lists(modules, max_size=4), st.lists(rows, max_size=4))


def shot(body, config=None):
    return ("module", body[0], body[1], config)


@st.composite
def edited(draw, body):
    """``(how, body')``: ``body`` itself, a copy of it with new (equal) devices and shapes as plain tuples, or one
    item of it replaced by another draw."""
    mods, tensor_rows = list(body[0]), list(body[1])
    how = draw(st.sampled_from(["same", "copy", "module", "row"]))
    if how == "copy":
        tensor_rows = [(*r[:4], tuple(r[4]), *r[5:10], torch.device(str(r[10]))) for r in tensor_rows]
    elif how == "module" and mods:
        mods[draw(st.integers(0, len(mods) - 1))] = draw(modules)
    elif how == "row" and tensor_rows:
        i = draw(st.integers(0, len(tensor_rows) - 1))
        row = list(tensor_rows[i])
        j = draw(st.integers(0, 10))
        row[j] = draw(rows)[j]
        tensor_rows[i] = tuple(row)
    return how, (mods, tensor_rows)


def same_kinds(a, b) -> bool:
    """``a == b`` with every scalar of the same type as its counterpart (``1``, ``1.0`` and ``True`` apart)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (isinstance(a, list) == isinstance(b, list) and len(a) == len(b)
                and all(same_kinds(x, y) for x, y in zip(a, b)))
    if isinstance(a, (int, float, str, bytes)) or a is None:
        return type(a) is type(b) and a == b
    return a == b


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_kept_forms_are_equal_exactly_when_the_snapshots_are(data):
    a = data.draw(bodies)
    how, b = data.draw(edited(a))
    sa, sb = shot(a), shot(b)
    ka, kb = provenance._kept(sa), provenance._kept(sb)
    assert ka[0] == kb[0] == "module-kept"
    # Never equal where the snapshots differ (the wrong object); equal where they are the same values of the same
    # types. Where a value changed only its type (1 became True), the kept form differs, stricter than ==: the
    # module is keyed by content then, never wrongly.
    assert (ka == kb) == same_kinds(a, b)
    if ka == kb:
        assert sa == sb
    if how in ("same", "copy"):
        assert ka == kb


def test_one_config_object_compares_as_in_the_snapshot():
    body = ([], [])
    exact = ("exact", dict, b"x", b"")
    assert provenance._kept(shot(body, exact)) == provenance._kept(shot(body, ("exact", dict, b"x", b"")))
    assert provenance._kept(shot(body, exact)) != provenance._kept(shot(body, ("exact", dict, b"y", b"")))
    # an undescribable config: a new marker in each snapshot, never equal to another
    assert provenance._kept(shot(body, provenance._UnknownType())) != \
        provenance._kept(shot(body, provenance._UnknownType()))


def test_a_snapshot_with_an_unhashable_class_is_kept_whole_and_still_compares():
    m = torch.nn.Sequential(OddModule(), torch.nn.Linear(2, 2))
    before = provenance.snapshot(m, repr)
    kept = provenance._kept(before)
    assert kept is before  # kept whole
    assert provenance._kept(provenance.snapshot(m, repr)) == kept
    m[1].weight.requires_grad_(False)
    assert provenance._kept(provenance.snapshot(m, repr)) != kept


@pytest.mark.parametrize("impl", ["c", "python"], indirect=True)
def test_a_remembered_module_is_its_entry_until_it_changes(impl, monkeypatch):
    """``origin_of`` compares the kept form: the entry while unchanged, then not. Here the tensors lie in no entry
    mapping, so the pages check is taken as passed (test_pristine_pages.py and the load identity tests run it
    on real mappings)."""
    monkeypatch.setattr(provenance, "_still_mapped", lambda ranges: True)
    m = torch.nn.Linear(3, 3)
    provenance.remember_origin(m, "k" * 32, repr)
    rec = provenance._origins[id(m)]
    assert rec[2][0] == ("module-digest" if impl == "c" else "module-kept") and isinstance(rec[2][1], bytes)
    assert provenance.origin_of(m) == "k" * 32
    m.train(False)
    assert provenance.origin_of(m) is None
    m.train(True)
    assert provenance.origin_of(m) == "k" * 32
    m.weight.requires_grad_(False)
    assert provenance.origin_of(m) is None
