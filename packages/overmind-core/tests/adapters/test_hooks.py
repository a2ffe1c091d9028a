"""The hook contract: every hook declared in hookspecs is called by the core during a real load (datasette's
guard: a hook nothing calls is dead, a hook no test reaches is untested), and impl options that Overmind's
per-adapter calls cannot honour are refused when the adapter registers."""
from __future__ import annotations

import contextlib
import warnings
from importlib import metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import overmind
from overmind import activation
from overmind.adapters import discovery, hooks, hookspecs
from overmind.adapters.discovery import AdapterError
from overmind.adapters.hookspecs import SPECS, Kind, When
from overmind.fallback import OvermindWarning
from overmind.testing import overmind_mapped


@pytest.fixture(autouse=True)
def only_test_adapters(monkeypatch):
    names = {ep.name for ep in metadata.entry_points(group=discovery.GROUP)}
    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", ",".join(sorted(names)))
    activation.reset()
    yield
    activation.reset()


class Token:
    """A value the core cannot key by itself once an adapter claims it."""

    def __init__(self, n: int) -> None:
        self.n = n


def make_pair(x, token):
    import torch

    return {"x": x, "weight": torch.arange(4.0), "token": token}


class Recorder:
    """An adapter implementing every hook, recording each call (and changing nothing)."""

    def __init__(self) -> None:
        self.called: dict[str, int] = {}

    def _saw(self, name: str) -> None:
        self.called[name] = self.called.get(name, 0) + 1

    @overmind.hookimpl
    def overmind_patch_targets(self):
        self._saw("overmind_patch_targets")
        return []

    @overmind.hookimpl
    def overmind_patch_later(self):
        self._saw("overmind_patch_later")
        return []

    @overmind.hookimpl
    def overmind_reducers(self):
        self._saw("overmind_reducers")
        return {}

    @overmind.hookimpl
    def overmind_self_check(self):
        self._saw("overmind_self_check")
        return None

    @overmind.hookimpl
    def overmind_prepare_result(self, result, loader):
        self._saw("overmind_prepare_result")
        return contextlib.nullcontext()

    @overmind.hookimpl
    def overmind_entry_metadata(self, result, loader):
        self._saw("overmind_entry_metadata")
        return {"recorder": loader.name}

    @overmind.hookimpl
    def overmind_derived_paths(self, result, loader, arguments):
        self._saw("overmind_derived_paths")
        return []

    @overmind.hookimpl
    def overmind_before_unpickle(self, metadata):
        self._saw("overmind_before_unpickle")
        assert metadata["recorder"].endswith("make_pair")

    @overmind.hookimpl
    def overmind_after_unpickle(self, result, metadata):
        self._saw("overmind_after_unpickle")

    @overmind.hookimpl
    def overmind_key_for_value(self, value):
        if isinstance(value, Token):
            self._saw("overmind_key_for_value")
            return ("Token", value.n)

    @overmind.hookimpl
    def overmind_key_parts(self, loader, arguments):
        self._saw("overmind_key_parts")
        return ["recorded"]


def test_every_hook_in_the_specs_is_called_by_a_load(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    assert {n for n in dir(Recorder) if n.startswith("overmind_")} == set(SPECS)  # a new hook needs a row here
    recorder = Recorder()
    discovery.register_adapter("recorder", recorder)
    activation.activate(strict=True)
    first = overmind.load(make_pair, 1, token=Token(2))
    second = overmind.load(make_pair, 1, token=Token(2))
    assert overmind_mapped(first["weight"].data_ptr()) and overmind_mapped(second["weight"].data_ptr())
    assert set(recorder.called) == set(SPECS), sorted(set(SPECS) - set(recorder.called))


def test_every_spec_has_a_kind_and_a_when():
    for name, spec in SPECS.items():
        assert isinstance(spec.kind, Kind) and isinstance(spec.when, When), name
    # the hooks that run before their library is imported (a key, an entry being unpickled)
    assert {n for n, s in SPECS.items() if s.when is When.ALWAYS} == {
        "overmind_key_for_value", "overmind_key_parts", "overmind_before_unpickle", "overmind_after_unpickle"}


def test_a_live_only_hook_waits_for_the_adapters_library(monkeypatch):
    class Late:
        @overmind.hookimpl
        def overmind_entry_metadata(self, result, loader):
            return {"late": True}

        @overmind.hookimpl
        def overmind_key_parts(self, loader, arguments):
            return ["late"]

    state = discovery.register_adapter("late", Late())
    state.modules = (("overmind_no_such_library",),)  # as if its library were not imported yet
    assert hooks.entry_metadata(object(), None) == {}
    assert hooks.key_parts(None, {}) == [["late"]]  # key hooks run in every process


@pytest.mark.parametrize("option", ["hookwrapper", "wrapper"])
def test_wrapper_impls_are_refused_at_registration(option):
    class Wrapping:
        @overmind.hookimpl(**{option: True})
        def overmind_key_parts(self, loader, arguments):
            yield

    with pytest.raises(AdapterError, match=rf"adapter wrapping .*overmind_key_parts.*{option}=True.*Drop {option}=True"):
        discovery.register_adapter("wrapping", Wrapping())
    assert discovery.get_manager().get_plugin("wrapping") is None
    assert hooks.key_parts(None, {}) == []


def test_a_failing_hook_is_named_and_skipped():
    class Broken:
        @overmind.hookimpl
        def overmind_key_for_value(self, value):
            raise RuntimeError("boom")

    discovery.register_adapter("broken", Broken())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hooks.key_for_value(Token(1)) is None
    [w] = [w for w in caught if issubclass(w.category, OvermindWarning)]
    assert "adapter broken failed in overmind_key_for_value" in str(w.message)


@settings(max_examples=60, deadline=None)
@given(opts=st.fixed_dictionaries({}, optional={
    "hookwrapper": st.booleans(), "optionalhook": st.booleans(), "tryfirst": st.booleans(),
    "trylast": st.booleans(), "specname": st.none() | st.sampled_from(["overmind_key_parts", "x"]),
    "wrapper": st.booleans()}), bare=st.booleans())
def test_the_impl_marker_writes_what_pluggys_writes(opts, bare):
    """``overmind.hookimpl`` is Overmind's own (activate() does not import pluggy): the attribute and options it
    writes are pluggy's ``HookimplMarker("overmind")``'s, bare or called with any options."""
    import pluggy

    def ours():
        pass

    def theirs():
        pass

    if bare:
        hookspecs.hookimpl(ours)
        pluggy.HookimplMarker("overmind")(theirs)
    else:
        hookspecs.hookimpl(**opts)(ours)
        pluggy.HookimplMarker("overmind")(**opts)(theirs)
    assert vars(ours) == vars(theirs)


@settings(max_examples=30, deadline=None)
@given(firstresult=st.booleans(), historic=st.booleans())
def test_the_spec_marker_writes_what_pluggys_writes(firstresult, historic):
    import pluggy

    def ours():
        pass

    def theirs():
        pass

    outcomes = []
    for marker, fn in ((hookspecs.hookspec, ours), (pluggy.HookspecMarker("overmind"), theirs)):
        try:
            marker(firstresult=firstresult, historic=historic)(fn)
            outcomes.append(vars(fn))
        except ValueError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]


def test_each_spec_records_the_parameters_of_its_hook():
    import inspect

    for name, spec in hookspecs.SPECS.items():
        assert spec.args == tuple(inspect.signature(getattr(hookspecs, name)).parameters), name


def test_routed_classmethods_are_the_originals_bound_to_the_class_a_call_reaches():
    from overmind.adapters import patching

    class Base:
        @classmethod
        def load(cls, x):
            return (cls, x)

    class Sub(Base):
        pass

    class Own(Base):
        @classmethod
        def load(cls, x):  # its own loader, not patched: a call on Own is not routed
            return x

    target = patching.PatchTarget(Base, "load", kind="classmethod", adapter="test")
    assert patching.routed_classmethods(Sub) == []
    patching.apply(target, lambda fn, *a, **k: fn(*a, **k))
    try:
        [fn] = patching.routed_classmethods(Sub)
        assert fn.__self__ is Sub and fn.__func__ is vars(Base)["load"].__func__.__wrapped__
        assert fn(3) == (Sub, 3), "the original, bound to the class the call is made on"
        assert patching.routed_classmethods(Own) == []
        assert [f.__self__ for f in patching.routed_classmethods(Base)] == [Base]
    finally:
        patching.restore(target)
    assert patching.routed_classmethods(Sub) == []
