"""The table of objects built ahead (``entries/prebuilt.py``), in one process: an object is taken once and only
for the entry it was built from, the call's own arguments go where the placeholders were (and only where every
reference to one was found), and an object whose rebuild read a variable this process has otherwise is not
taken. The template's side, with real processes, is ``test_run_prebuilt.py``.
"""
from __future__ import annotations

import pytest
import torch

from overmind.entries import arguments_ref, prebuilt


@pytest.fixture(autouse=True)
def _empty_table():
    yield
    for key in list(prebuilt.held()):
        prebuilt.drop(key)


def _placeholder(name: str, value) -> arguments_ref.Placeholder:
    return arguments_ref.Placeholder((name,), arguments_ref.type_name(value))


def test_an_object_is_taken_once_and_only_for_its_entry():
    obj = {"weights": torch.ones(2)}
    prebuilt.hold("k", "entry-1", obj)
    assert prebuilt.take("k", "entry-2") is prebuilt.NOTHING, "another entry under the key: not this object"
    assert prebuilt.take("k", "entry-1") is prebuilt.NOTHING, "and it was dropped"
    prebuilt.hold("k", "entry-1", obj)
    assert prebuilt.take("k", "entry-1") is obj
    assert prebuilt.take("k", "entry-1") is prebuilt.NOTHING, "a second call rebuilds"


def test_the_calls_own_arguments_go_where_the_placeholders_are():
    vae, net = torch.nn.Linear(1, 1), torch.nn.Linear(2, 2)
    placeholders = [_placeholder("vae", vae), _placeholder("net", net)]

    class Pipeline:
        pass

    pipe = Pipeline()
    pipe.vae = placeholders[0]
    pipe.nets = [placeholders[1], placeholders[1]]
    pipe.components = {"vae": placeholders[0]}
    prebuilt.hold("k", "e", pipe, placeholders)
    got = prebuilt.take("k", "e", {"vae": vae, "net": net})
    assert got is pipe and pipe.vae is vae and pipe.nets == [net, net] and pipe.components["vae"] is vae
    assert all(p is not got for p in placeholders)


def test_arguments_that_do_not_fit_raise_as_a_rebuild_does():
    vae = torch.nn.Linear(1, 1)
    placeholders = [_placeholder("vae", vae)]
    prebuilt.hold("k", "e", {"vae": placeholders[0]}, placeholders)
    with pytest.raises(arguments_ref.ArgumentMismatch):
        prebuilt.take("k", "e", {"vae": "not a module"})


@pytest.mark.parametrize("holder, why", [
    (lambda p: (p,), "held by a tuple"),
    (lambda p: {p: 1}, "a key of a dict"),
    (lambda p: {frozenset([1]): p, "also": (p,)}, "held by a tuple"),
])
def test_a_reference_that_cannot_be_put_back_is_refused(holder, why):
    placeholders = [_placeholder("x", torch.nn.Linear(1, 1))]
    obj = holder(placeholders[0])
    found = prebuilt.places(obj, placeholders)
    assert isinstance(found, str) and why in found
    with pytest.raises(ValueError):
        prebuilt.hold("k", "e", obj, placeholders)


def test_a_reference_held_where_it_cannot_be_written_or_seen_is_refused():
    import ctypes

    placeholders = [_placeholder("x", torch.nn.Linear(1, 1))]
    obj = {"x": placeholders[0]}
    assert not isinstance(prebuilt.places(obj, placeholders), str)

    def holds(p):
        return lambda: p

    closure = holds(placeholders[0])  # a closure's cell holds it too
    found = prebuilt.places(obj, placeholders)
    assert isinstance(found, str) and "held by a cell" in found
    del closure
    # a reference from C (a library's structure): no container the collector can show holds it
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(placeholders[0]))
    try:
        found = prebuilt.places(obj, placeholders)
        assert isinstance(found, str) and "the collector does not see" in found
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(placeholders[0]))


def test_an_object_whose_rebuild_read_a_variable_set_otherwise_here_is_not_taken(monkeypatch):
    monkeypatch.setenv("OM_PREBUILT_TEST", "template's")
    prebuilt.hold("k", "e", [1], environment={"OM_PREBUILT_TEST": "template's", "OM_PREBUILT_ABSENT": None})
    monkeypatch.setenv("OM_PREBUILT_TEST", "mine")
    assert prebuilt.take("k", "e") is prebuilt.NOTHING
    monkeypatch.setenv("OM_PREBUILT_TEST", "template's")
    prebuilt.hold("k", "e", [1], environment={"OM_PREBUILT_TEST": "template's", "OM_PREBUILT_ABSENT": None})
    assert prebuilt.take("k", "e") == [1]
