"""What a provenance record keeps of a module (``provenance.fingerprint``) never calls a changed module unchanged.

``origin_of`` keys a module passed to a load as the entry it was rebuilt from while its fingerprint equals the one
taken at the rebuild. Where ``overmind.native._C`` is, the fingerprint is one byte string built in C
(``csrc/provenance_digest.cpp``), not the snapshot; a fingerprint looser than the snapshot would key an edited module
as its entry, the wrong object. Hypothesis builds module trees (``_support/module_trees.py``), fingerprints and
snapshots one, makes one edit somewhere in it, and checks: no edit, equal fingerprints; an edit the snapshot sees,
different fingerprints. The fingerprint may be stricter (a ``None`` parameter registered, a name that is a ``str``
subclass, ``training`` set to ``1``): that only keys the module by content.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support.module_trees import trees
from overmind.keys import provenance

pytestmark = pytest.mark.usefixtures("impl")


class Name(str):
    pass


def _tensors(m):
    return [(d, k) for d in (m._parameters, m._buffers) for k, v in d.items() if v is not None]


def _first_tensor(m):
    found = _tensors(m)
    return found[0][0][found[0][1]] if found else None


def _replace_tensor(m):
    for d, k in _tensors(m):
        v = d[k]
        d[k] = torch.nn.Parameter(v.detach().clone(), v.requires_grad) if isinstance(v, torch.nn.Parameter) \
            else v.clone()
        return


def _swap_data(m):
    t = _first_tensor(m)
    if t is not None and not t.is_meta:
        t.data = torch.zeros_like(t.data)


def _flip_requires_grad(m):
    t = _first_tensor(m)
    if t is not None and (t.is_floating_point() or t.is_complex()) and t.grad is None:
        t.requires_grad_(not t.requires_grad)


def _retype(m):
    t = _first_tensor(m)
    if t is not None:
        other = {torch.float64: torch.float32, torch.complex64: torch.complex128, torch.complex128: torch.complex64}
        t.data = t.data.to(other.get(t.dtype, torch.float64))


def _restride(m):
    t = _first_tensor(m)
    if t is not None and not t.is_meta and t.numel() > 1:
        with torch.no_grad():
            t.as_strided_((1,), (1,), 1)


def _rename_child(m):
    if m._modules:
        k = next(iter(m._modules))
        m._modules["renamed"] = m._modules.pop(k)


def _reorder_children(m):
    if len(m._modules) > 1:
        k = next(iter(m._modules))
        m._modules[k] = m._modules.pop(k)


def _name_subclass(m):
    if m._modules:
        k = next(iter(m._modules))
        v = m._modules.pop(k)
        m._modules[Name(k)] = v


def _replace_child(m):
    if m._modules:
        k = next(iter(m._modules))
        m._modules[k] = torch.nn.Module()


EDITS = {
    "none": lambda m: None,
    "training flipped": lambda m: setattr(m, "training", not m.training),
    "training as an int": lambda m: setattr(m, "training", int(m.training)),
    "forward hook": lambda m: m.register_forward_hook(lambda *a: None),
    "forward pre-hook": lambda m: m.register_forward_pre_hook(lambda *a: None),
    "tensor replaced": _replace_tensor,
    "data swapped": _swap_data,
    "requires_grad flipped": _flip_requires_grad,
    "dtype changed": _retype,
    "restrided": _restride,
    "parameter registered as None": lambda m: m._parameters.__setitem__("late", None),
    "parameter added": lambda m: m._parameters.__setitem__("late", torch.nn.Parameter(torch.zeros(2))),
    "buffer added": lambda m: m._buffers.__setitem__("late", torch.zeros(2)),
    "tensor attribute added": lambda m: object.__setattr__(m, "late", torch.zeros(1)),
    "child renamed": _rename_child,
    "children reordered": _reorder_children,
    "child name a str subclass": _name_subclass,
    "child replaced": _replace_child,
    "child added": lambda m: m._modules.__setitem__("late", torch.nn.Linear(1, 1)),
    "child set to None": lambda m: m._modules.__setitem__("late", None),
}


def _form(m):
    return provenance.fingerprint(m, repr)[0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), edit=st.sampled_from(sorted(EDITS)), where=st.integers(0, 50))
def test_an_edit_the_snapshot_sees_changes_the_fingerprint(tree, edit, where):
    before_shot, before = provenance.snapshot(tree, repr), _form(tree)
    assert _form(tree) == before  # nothing changed: equal
    modules = list(tree.modules())
    EDITS[edit](modules[where % len(modules)])
    after_shot, after = provenance.snapshot(tree, repr), _form(tree)
    if edit == "none":
        assert after == before
    if after_shot != before_shot:
        assert after != before, edit


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees())
def test_the_fingerprint_names_the_ranges_the_snapshot_names(tree):
    assert sorted(provenance.fingerprint(tree, repr)[2]) == sorted(provenance._ranges(provenance.snapshot(tree, repr)))


def test_the_fingerprint_is_built_in_c_where_the_extension_is(impl):
    m = torch.nn.Linear(2, 2)
    assert _form(m)[0] == ("module-digest" if impl == "c" else "module-kept")


def test_a_record_keeps_every_class_its_fingerprint_names_alive(impl):
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    m.extra = torch.nn.Parameter(torch.zeros(1))
    provenance.remember_origin(m, "k" * 32, repr)
    held = provenance._origins[id(m)][3]
    if impl == "c":
        assert {torch.nn.Sequential, torch.nn.Linear, torch.nn.ReLU, torch.nn.Parameter} <= set(held)


def test_the_fingerprint_sees_a_config_edit(impl):
    m = torch.nn.Linear(2, 2)
    m.config = {"a": 1}
    before = _form(m)
    m.config["a"] = 2
    assert _form(m) != before


def test_under_a_torch_function_mode_the_rows_come_from_python_and_compare_equal():
    m = torch.nn.Linear(2, 2)  # `with torch.device("cuda"): Pipeline.from_pretrained(..., vae=vae)` is common
    before = _form(m)
    with torch.device("meta"):
        assert _form(m) == before
    assert _form(m) == before


class _UnhashableMeta(type(torch.nn.Module)):
    __hash__ = None  # type: ignore[assignment]

    def __eq__(cls, other):
        return cls is other


class OddModule(torch.nn.Module, metaclass=_UnhashableMeta):
    pass


def test_a_module_of_an_unhashable_class_is_remembered_and_compared(impl):
    m = torch.nn.Sequential(OddModule(), torch.nn.Linear(2, 2))
    before = _form(m)
    assert _form(m) == before
    m[1].weight.requires_grad_(False)
    assert _form(m) != before
    provenance.remember_origin(m, "k" * 32, repr)  # kept alive by the record, though it cannot be hashed
    assert id(m) in provenance._origins
