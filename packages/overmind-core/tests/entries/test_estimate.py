"""``entries/estimate.py`` finds exactly the storages a plain walk of the object graph finds: the values of dicts, the
items of lists, tuples and sets, the ``__dict__`` of other objects (not classes), stopping at tensors and atoms.
Generated graphs (shared storages, views, meta tensors, empty and nested containers, cycles, objects whose truth
value must not be asked, proxies of one type wrapping a tensor or a dict) are compared with that walk written the
obvious way. The compiled walk (``csrc/tensor_walk.cpp``) finds the same tensor objects as the Python one
(``estimate._python_tensors``) on every generated graph, gives up past the same limit, and raises what Python raises."""
from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overmind.entries import estimate

ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), type)


def reference(result) -> set[tuple[str, int, int]]:
    """The storages of ``result`` by the plain walk (isinstance for every object)."""
    found, seen, stack = set(), set(), [result]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                s = obj.untyped_storage()
                found.add((str(s.device), s.data_ptr(), s.nbytes()))
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        elif isinstance(obj, type):
            continue
        else:
            d = getattr(obj, "__dict__", None)
            children = list(d.values()) if isinstance(d, dict) else []
        stack.extend(c for c in children if not isinstance(c, ATOMS))
    return found


class Holder:
    """A plain object holding attributes."""


class NoTruth:
    """An object whose truth value must never be asked (as a user's object might compute it, or fail)."""

    def __bool__(self):
        raise AssertionError("the estimate asked an object for its truth value")

    def __len__(self):
        raise AssertionError("the estimate asked an object for its length")


class Proxy:
    """An object that answers isinstance as the object it wraps (``__class__``), as wrapt's proxies do: two proxies
    of one type can be a tensor and a dict."""

    def __init__(self, target):
        object.__setattr__(self, "_target", target)

    @property
    def __class__(self):
        return type(self._target)

    def __getattr__(self, name):
        return getattr(self._target, name)


class MyDict(dict):
    pass


class MyList(list):
    pass


class MyStr(str):
    pass


BASE = torch.arange(64, dtype=torch.float32)


def tensors():
    return st.one_of(
        st.integers(1, 16).map(lambda n: torch.zeros(n)),
        st.integers(0, 32).map(lambda i: BASE[i:i + 8]),  # views of one storage
        st.just(BASE),
        st.integers(1, 8).map(lambda n: torch.empty(n, device="meta")),
        st.integers(1, 8).map(lambda n: torch.nn.Parameter(torch.ones(n))),
    )


ATOM_VALUES = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.booleans(), st.floats(allow_nan=False),
                        st.just(int), st.just(MyStr("s")), st.binary(max_size=3))


def graphs():
    def extend(children):
        def holder(values):
            h = Holder()
            for i, v in enumerate(values):
                setattr(h, f"a{i}", v)
            return h

        def no_truth(values):
            h = NoTruth()
            h.items = values
            return h

        return st.one_of(
            st.lists(children, max_size=5),
            st.lists(children, max_size=5).map(tuple),
            st.lists(children, max_size=5).map(MyList),
            st.dictionaries(st.text(max_size=3), children, max_size=5),
            st.dictionaries(st.text(max_size=3), children, max_size=5).map(collections.OrderedDict),
            st.dictionaries(st.text(max_size=3), children, max_size=5).map(MyDict),
            st.lists(children, max_size=4).map(holder),
            st.lists(children, max_size=4).map(no_truth),
            st.lists(ATOM_VALUES, max_size=4).map(frozenset),
            st.dictionaries(st.text(max_size=3), children, max_size=3).map(Proxy),
            tensors().map(Proxy),
        )

    return st.recursive(st.one_of(tensors(), ATOM_VALUES), extend, max_leaves=30)


@pytest.fixture(scope="module")
def walk(compiled_function):
    tensor_walk = compiled_function("tensor_walk")

    def compiled(result):
        return tensor_walk(result, torch.Tensor, estimate._ATOMS, estimate._ATOM_TYPES, estimate._BUILTIN_CONTAINERS,
                           estimate._COLLECTIONS, estimate.MAX_OBJECTS)
    return compiled


def _same_tensors(compiled, python) -> None:
    assert compiled is not None and python is not None
    assert len({id(t) for t in compiled}) == len(compiled), "each tensor once"
    assert {id(t) for t in compiled} == {id(t) for t in python}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), with_cycle=st.booleans())
def test_the_compiled_walk_finds_the_tensors_the_python_walk_finds(walk, graph, with_cycle):
    root = [graph, set(), collections.OrderedDict(), (), []]
    if with_cycle:
        root.append(root)
    _same_tensors(walk(root), estimate._python_tensors(root))


def test_a_real_model_and_an_odd_mapping_walk_the_same(walk):
    class Values(dict):
        hidden = torch.ones(2)

        def values(self):  # a mapping whose values() is its own: read through it, as Python does
            return [Values.hidden, *super().values()]

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2).half())
    model.extra = Values(a=BASE[2:4])
    model.ordered = collections.OrderedDict(b=BASE, c=torch.zeros(1))
    model.ordered.move_to_end("b")
    compiled, python = walk(model), estimate._python_tensors(model)
    _same_tensors(compiled, python)
    assert len(compiled) == 2 + 5 + 2 + 4  # conv, batch norm (with its buffers), linear, and the four held apart
    assert any(t is Values.hidden for t in compiled)


def test_an_attribute_error_is_passed_over_and_any_other_error_raised_both_ways(walk):
    class NoDict:
        __slots__ = ()

    class Broken:
        @property
        def __dict__(self):
            raise RuntimeError("a __dict__ that fails")

    assert walk([NoDict(), torch.zeros(1)]) is not None
    with pytest.raises(RuntimeError, match="a __dict__ that fails"):
        walk([Broken()])
    with pytest.raises(RuntimeError, match="a __dict__ that fails"):
        estimate._python_tensors([Broken()])


def test_the_compiled_walk_gives_up_past_the_limit(walk, monkeypatch):
    monkeypatch.setattr(estimate, "MAX_OBJECTS", 10)
    graph = [[torch.zeros(1)] for _ in range(20)]
    assert walk(graph) is None and estimate._python_tensors(graph) is None
    assert walk(graph[:4]) is not None and estimate._python_tensors(graph[:4]) is not None


def test_the_estimate_uses_the_compiled_walk_when_selected(impl, monkeypatch):
    from overmind.native import zerocopy

    assert (zerocopy.tensor_walk() is not None) == (impl == "c")
    called = []
    monkeypatch.setattr(estimate, "_python_tensors", lambda result: called.append(result) or [])
    estimate.storages([torch.zeros(1)])
    assert bool(called) == (impl == "python")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.booleans())
def test_the_estimate_finds_the_storages_the_plain_walk_finds(graph, with_cycle):
    root = [graph, set(), collections.OrderedDict(), (), []]
    if with_cycle:
        root.append(root)
    found = estimate.storages(root)
    assert found is not None
    keys = [(str(s.device), s.data_ptr(), s.nbytes()) for s in found]
    assert len(keys) == len(set(keys)), "each storage once"
    assert set(keys) == reference(root)
    assert estimate.total(found) == sum(n for _, _, n in set(keys))


def test_a_module_tree_and_a_vocabulary_sized_dict():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model.register_buffer("scale", torch.ones(3))
    model.extra = {"vocab": {f"tok{i}": i for i in range(50_000)}, "table": BASE[4:12]}
    found = estimate.storages(model)
    assert {(s.data_ptr(), s.nbytes()) for s in found} == {(d, n) for _, d, n in reference(model)}
    assert len(found) == 6  # 2 weights, 2 biases, the buffer, BASE


def test_a_walk_over_the_object_limit_gives_up(monkeypatch):
    monkeypatch.setattr(estimate, "MAX_OBJECTS", 10)
    assert estimate.storages([[torch.zeros(1)] for _ in range(20)]) is None
