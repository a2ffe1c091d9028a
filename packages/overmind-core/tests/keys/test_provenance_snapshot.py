"""The provenance snapshot sees every change that could make a module differ from what its entry rebuilt.

``origin_of`` keys a module as its entry only while a fresh snapshot equals the one taken at the rebuild
(and its pages are pristine, tested in test_pristine_pages.py). Each change below, made after the first
snapshot, must make the second one differ; no change must leave it equal. Every test runs with the walk in C
(``csrc/provenance_walk.cpp``) and in Python (the ``impl`` fixture).
"""
from __future__ import annotations

import pytest
import torch

from overmind.keys import provenance

pytestmark = pytest.mark.usefixtures("impl")


def no_config(config):
    return None


class Holder:
    """A plain attribute type (cached as not-a-tensor by the snapshot's attribute scan)."""


class TensorLike(torch.Tensor):
    pass


def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    m.extra = torch.zeros(3)  # a tensor attribute that is neither parameter nor buffer
    m[1].note = Holder()
    return m


def _swap_class(m):
    m[0].weight.__class__ = TensorLike


def _set_storage(m):
    with torch.no_grad():
        m[0].weight.set_(torch.zeros(4, 4))


def _nested_list_child(m):
    m[1] = torch.nn.ReLU()  # a same-type child in the same place: a new object


CHANGES = {
    "half": lambda m: m.half(),
    "replaced parameter": lambda m: setattr(m[0], "weight", torch.nn.Parameter(m[0].weight.detach().clone())),
    "parameter removed": lambda m: setattr(m[3], "bias", None),
    "replaced buffer": lambda m: setattr(m[2], "running_mean", torch.zeros(4)),
    "replaced tensor attribute": lambda m: setattr(m, "extra", torch.zeros(3)),
    "new tensor attribute": lambda m: setattr(m[1], "scale", torch.ones(1)),
    "tensor subclass attribute": lambda m: setattr(m[1], "note", torch.ones(1).as_subclass(TensorLike)),
    "data swapped": lambda m: setattr(m[0].weight, "data", torch.zeros(4, 4)),
    "set_ to another storage": _set_storage,
    "resized": lambda m: m.extra.resize_(5),
    "restrided": lambda m: m.extra.as_strided_((2,), (1,), 1),
    "requires_grad off": lambda m: m[0].weight.requires_grad_(False),
    "grad set": lambda m: setattr(m[0].weight, "grad", torch.ones(4, 4)),
    "class changed": _swap_class,
    "train mode": lambda m: m.train(False),
    "forward hook": lambda m: m[0].register_forward_hook(lambda *a: None),
    "forward pre-hook": lambda m: m[3].register_forward_pre_hook(lambda *a: None),
    "child replaced by the same type": _nested_list_child,
    "child added": lambda m: m.append(torch.nn.Tanh()),
    "config replaced": lambda m: setattr(m, "config", {"a": 2}),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_every_change_shows(what):
    m = make()
    m.config = {"a": 1}
    describe = repr
    before = provenance.snapshot(m, describe)
    kept = provenance._kept(before)  # the Python form a record keeps (test_provenance_kept.py)
    assert kept[0] == "module-kept"
    form = provenance.fingerprint(m, describe)[0]  # what a record keeps (test_provenance_digest.py)
    assert provenance.snapshot(m, describe) == before  # nothing changed: equal
    assert provenance._kept(provenance.snapshot(m, describe)) == kept
    assert provenance.fingerprint(m, describe)[0] == form
    CHANGES[what](m)
    assert provenance.snapshot(m, describe) != before, what
    assert provenance._kept(provenance.snapshot(m, describe)) != kept, what
    assert provenance.fingerprint(m, describe)[0] != form, what


def test_the_snapshot_lists_every_tensor_of_the_tree_once_per_place():
    m = make()
    shared = torch.nn.Linear(4, 4)
    m.append(shared)
    m.append(shared)  # one module twice: listed once, as modules() does
    shot = provenance.snapshot(m, no_config)
    assert len(shot[1]) == len(list(m.modules()))
    tensors = [t for mod in m.modules() for t in [*mod._parameters.values(), *mod._buffers.values()] if t is not None]
    tensors.append(m.extra)
    assert len(shot[2]) == len(tensors)
    assert sorted(row[1] for row in shot[2]) == sorted(t.untyped_storage().data_ptr() for t in tensors)


def test_a_module_cycle_does_not_hang():
    m = make()
    m[1].add_module("back", m)  # a cycle through _modules
    shot = provenance.snapshot(m, no_config)
    assert provenance.snapshot(m, no_config) == shot


def test_a_tensor_snapshot_sees_its_changes():
    t = torch.zeros(4)
    before = provenance.snapshot(t, no_config)
    assert provenance.snapshot(t, no_config) == before
    t.requires_grad_(True)
    assert provenance.snapshot(t, no_config) != before


def test_other_objects_are_not_tracked():
    assert provenance.snapshot({"a": torch.zeros(1)}, no_config) is None


class FrozenConfig(dict):
    """Like diffusers' FrozenDict: items mirrored as attributes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        for k, v in kw.items():
            setattr(self, k, v)


CONFIG_CHANGES = {
    "list value grown in place": lambda c: c["blocks"].append(4),
    "int became float": lambda c: dict.__setitem__(c, "scale", 1.0),
    "int became bool": lambda c: dict.__setitem__(c, "scale", True),
    "attribute changed": lambda c: setattr(c, "scale", 2),
    "key added": lambda c: dict.__setitem__(c, "extra", None),
    "nested dict edited": lambda c: c["nested"].update(k="w"),
}


@pytest.mark.parametrize("what", list(CONFIG_CHANGES))
def test_a_config_changed_in_place_shows(what):
    m = make()
    m.config = FrozenConfig(blocks=[1, 2], scale=1, name="vae", nested={"k": "v"})

    def describe(config):
        raise AssertionError("a plain config is compared by its exact form, not described")

    before = provenance.snapshot(m, describe)
    assert provenance.snapshot(m, describe) == before
    CONFIG_CHANGES[what](m.config)
    assert provenance.snapshot(m, describe) != before, what


def test_a_config_with_other_values_is_described():
    m = make()
    m.config = FrozenConfig(dtype=torch.float16, blocks=[1])  # a torch.dtype: not plain
    described = []

    def describe(config):
        described.append(config)
        return repr(sorted(config.items(), key=str))

    before = provenance.snapshot(m, describe)
    assert described and provenance.snapshot(m, describe) == before
    m.config["blocks"].append(2)
    assert provenance.snapshot(m, describe) != before


def test_an_undescribable_config_never_matches():
    from overmind.errors import Unkeyable

    m = make()
    m.config = object()

    def describe(config):
        raise Unkeyable("no")

    assert provenance.snapshot(m, describe) != provenance.snapshot(m, describe)
