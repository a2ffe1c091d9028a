"""What a loader writes outside its result is recorded on the miss and made again on every hit
(``overmind/loading/writes``, ``overmind/entries/writes.py``).

In this process, generated sequences of writes to a module's registries, globals and class attributes
(``_support/writes_targets.py``) are recorded, pickled with their result, and replayed over a fresh copy of that
module's state: the state must be what the writes left, with the result's objects replaced by the rebuilt ones; a
write a hit cannot make (an item removed or replaced) must be found as such. In fresh processes, a loader whose
constructor fills the module's registries leaves a process that only hit exactly as plain leaves it, and a loader
that removes a registry item, or stores a value that cannot be pickled, is not cached, silently.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support import pythonpath_env
from _support import writes_targets as wt
from overmind.entries import pickling
from overmind.entries import writes as entry_writes
from overmind.loading.writes import changes, recording, replay
from overmind.testing import run_fresh

TARGET = wt.__name__
KEYS = st.sampled_from(["a", "b", "c", "d"])
ATOMS = st.one_of(st.integers(-3, 3), st.text("xyz", max_size=3), st.none(), st.tuples(st.integers(0, 2)))
INDEX = st.integers(0, 3)  # an object of the result
VALUE = st.one_of(ATOMS.map(lambda v: ("atom", v)), INDEX.map(lambda i: ("result", i)), st.just(("spec", None)))

REPLAYABLE_OPS = st.one_of(
    st.tuples(st.just("registry"), KEYS, VALUE),
    st.tuples(st.just("ordered"), KEYS, VALUE),
    st.tuples(st.just("name"), VALUE),
    st.tuples(st.just("tag"), ATOMS),
    st.tuples(st.just("by_object"), INDEX, ATOMS),
    st.tuples(st.just("by_name"), KEYS, INDEX),
    st.tuples(st.just("live"), INDEX),
    st.tuples(st.just("counter")),
    st.tuples(st.just("setting"), ATOMS),
    st.tuples(st.just("extra"), KEYS, VALUE),
    st.tuples(st.just("drop_extra"), KEYS),
    st.tuples(st.just("thing"), KEYS, VALUE),
)
UNREPLAYABLE_OPS = st.one_of(st.tuples(st.just("pop_builtin")), st.tuples(st.just("replace_first_name")))


@pytest.fixture
def impl_of(monkeypatch):
    """``impl_of(name)``: the marks computed by the compiled extension ("c") or its Python twin, for one test."""
    from overmind.native import zerocopy

    def select(name: str) -> None:
        monkeypatch.setenv(zerocopy.ENV, name)
        assert zerocopy._select() == name

    yield select
    monkeypatch.delenv(zerocopy.ENV)
    zerocopy._select()


def _value(spec, result):
    kind, v = spec
    return result[v] if kind == "result" else wt.SPEC if kind == "spec" else v


def _run(op, result) -> None:
    kind, *args = op
    if kind == "registry" and args[0] not in wt.REGISTRY:  # a registry fills up; replacing an item is the other case
        wt.REGISTRY[args[0]] = _value(args[1], result)
    elif kind == "ordered" and args[0] not in wt.ORDERED:
        wt.ORDERED[args[0]] = _value(args[1], result)
    elif kind == "name":
        wt.NAMES.append(_value(args[0], result))
    elif kind == "tag":
        wt.TAGS.add(args[0])
    elif kind == "by_object" and result[args[0]] not in wt.BY_OBJECT:
        wt.BY_OBJECT[result[args[0]]] = args[1]
    elif kind == "by_name" and args[0] not in wt.BY_NAME:
        wt.BY_NAME[args[0]] = result[args[1]]
    elif kind == "live":
        wt.LIVE.add(result[args[0]])
    elif kind == "counter":
        wt.COUNTER += 1
    elif kind == "setting":
        wt.SETTING = args[0]
    elif kind == "extra":
        setattr(wt, "extra_" + args[0], _value(args[1], result))
    elif kind == "drop_extra" and hasattr(wt, "extra_" + args[0]):
        delattr(wt, "extra_" + args[0])
    elif kind == "thing":
        setattr(wt.Thing, "set_" + args[0], _value(args[1], result))
    elif kind == "pop_builtin":
        wt.REGISTRY.pop("builtin", None)
    elif kind == "replace_first_name":
        wt.NAMES[0] = "replaced"


def _shown(value, result):
    for i, obj in enumerate(result):
        if value is obj:
            return ("result", i)
    if value is wt.SPEC:
        return ("spec",)
    return ("value", repr(value))


def _state(result) -> dict:
    """The target module's state, objects of ``result`` shown by their index and SPEC by identity."""
    return {
        "registry": [(k, _shown(v, result)) for k, v in wt.REGISTRY.items()],
        "ordered": [(k, _shown(v, result)) for k, v in wt.ORDERED.items()],
        "names": [_shown(v, result) for v in wt.NAMES],
        "tags": sorted(map(repr, wt.TAGS)),
        "by_object": sorted((_shown(k, result), v) for k, v in wt.BY_OBJECT.items()),
        "by_name": sorted((k, _shown(v, result)) for k, v in wt.BY_NAME.items()),
        "live": sorted(_shown(v, result) for v in wt.LIVE),
        "counter": wt.COUNTER, "setting": wt.SETTING,
        "extra": sorted((n, _shown(v, result)) for n, v in vars(wt).items() if n.startswith("extra_")),
        "thing": sorted((n, _shown(v, result)) for n, v in vars(wt.Thing).items() if n.startswith("set_")),
    }


def _record(ops, result) -> changes.Found:
    before = recording.start()
    for op in ops:
        _run(op, result)
    return recording.finish(before)


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_recorded_writes_replayed_over_a_fresh_state_leave_what_the_loader_left(implementation, impl_of):
    """Against the compiled marks and their Python twin."""
    impl_of(implementation)
    _replayed_over_a_fresh_state()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(REPLAYABLE_OPS, max_size=12))
def _replayed_over_a_fresh_state(ops):
    wt.reset()
    result = [wt.Box(i) for i in range(4)]
    found = _record(ops, result)
    assert found.unreplayable is None, found.unreplayable
    expected = _state(result)
    mine = [w for w in found.writes if w.place.module == TARGET]
    pickled = pickling.dumps(entry_writes.Recorded(result, replay.for_entry(mine, result)))  # as an entry pickles
    wt.reset()
    rebuilt = pickling.loads(pickled.skeleton, None, pickled.pickler)
    entry_writes.apply(rebuilt.writes)
    assert _state(rebuilt.result) == expected  # SPEC shown by identity: a found value is that very object


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_a_removed_or_replaced_registry_item_is_found_unreplayable(implementation, impl_of):
    impl_of(implementation)
    _found_unreplayable()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(REPLAYABLE_OPS, max_size=6), UNREPLAYABLE_OPS, st.lists(REPLAYABLE_OPS, max_size=6))
def _found_unreplayable(head, bad, tail):
    wt.reset()
    result = [wt.Box(i) for i in range(4)]
    found = _record(head + [bad] + tail, result)
    assert found.unreplayable is not None and TARGET in found.unreplayable


def test_taken_back_restores_the_state_the_loader_found_and_then_its_own():
    wt.reset()
    result = [wt.Box(i) for i in range(4)]
    ops = [("registry", "a", ("result", 1)), ("counter",), ("thing", "b", ("atom", 3)), ("live", 2),
           ("name", ("atom", "n")), ("by_object", 0, "x"), ("extra", "c", ("spec", None))]
    start = _state(result)
    found = _record(ops, result)
    after = _state(result)
    with replay.taken_back([w for w in found.writes if w.place.module == TARGET]):
        assert _state(result) == start
    assert _state(result) == after


PROCESS = """
import os, warnings
import torch
import overmind
from overmind.testing import report
from _support import writes_targets as wt

torch.manual_seed(0)  # Net() draws its initial weights: a seeded script is served (test_random_variants.py)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = getattr(wt, os.environ["LOADER"])
    net = overmind.load(loader, os.environ["NET_PATH"]) if os.environ["VIA"] == "overmind" else loader(
        os.environ["NET_PATH"])
state = wt.state()
state["registry_is_result"] = wt.REGISTRY.get("Net") is net.lin
state["ordered_is_result"] = list(wt.ORDERED.values()) == [net] and wt.ORDERED[0] is net
state["said"] = [(w.category.__name__, str(w.message)) for w in caught]
report(state)
"""


def _entries(env) -> int:
    return run_fresh("import overmind\nfrom overmind.testing import report\n"
                     "report(len(overmind.cache_info().entries))", env=env)


@pytest.mark.parametrize("loader", ["load_net", "load_net_dropping", "load_net_registering_a_generator"])
def test_a_process_that_only_hit_has_the_registries_plain_fills(tmp_path, overmind_runtime, loader):
    import torch

    torch.manual_seed(5)
    path = str(tmp_path / "net.pt")
    torch.save(wt.Net().state_dict(), path)
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": overmind_runtime,
           "LOADER": loader}
    plain = run_fresh(PROCESS, env={**env, "VIA": "plain"})
    first = run_fresh(PROCESS, env={**env, "VIA": "overmind"})
    published = _entries(env)
    second = run_fresh(PROCESS, env={**env, "VIA": "overmind"})
    assert first == plain and second == plain
    assert plain["registry_is_result"] and plain["ordered_is_result"] and plain["spec_is_found"]
    if loader == "load_net":
        assert published >= 1 and plain["counter"] == 1
    else:  # removing an item, or storing what cannot be kept, is no write a hit can make: not cached, silently
        assert published == 0


def test_the_compiled_scan_finds_what_its_python_twin_finds():
    """Over every module imported here (torch and the test libraries): the same containers, by identity, in order."""
    import sys
    from types import ModuleType

    from overmind.loading.writes import watched
    from overmind.native import zerocopy

    compiled = zerocopy.module_scan()
    if compiled is None:
        pytest.skip("the compiled extension is not active")
    kinds: dict = {}

    def classify(kind):
        return watched._kind_of(kind)

    compared = 0
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None) if isinstance(module, ModuleType) else None
        if type(namespace) is not dict:
            continue
        ours = compiled(namespace, name, kinds, classify)
        twin = watched._scan(namespace, name, kinds, classify)
        assert [(k, n, id(v)) for k, n, v in ours] == [(k, n, id(v)) for k, n, v in twin], name
        compared += len(ours)
    assert compared > 1000
