"""The one plugin body of the Hugging Face adapters, over a plugin module that declares a library of its own."""
from __future__ import annotations

import sys
import types
import warnings

import pytest

from overmind import OvermindWarning
from overmind.adapter import Spec, Uncacheable
from overmind.testing import hookspec_manager
from overmind_hf.adapter import HubAdapter

LIB = "overmind_hf_testlib"


class Model:
    @classmethod
    def from_pretrained(cls, path):
        return cls()


class Override(Model):
    @classmethod
    def from_pretrained(cls, path):
        return super().from_pretrained(path)


@pytest.fixture
def plugin(monkeypatch):
    """A library module holding ``Model``, and a plugin module declaring it the way plugin.py files
    do, with ``adapter``, the object an entry point names."""
    lib = types.ModuleType(LIB)
    lib.Model = Model
    monkeypatch.setitem(sys.modules, LIB, lib)
    mod = types.ModuleType("overmind_hf_testplugin")
    mod.ADAPTER = LIB
    mod.SPECS = (Spec(f"{LIB}:Model"),)
    mod.PRELOAD_IF_PRESENT = ("overmind_hf_no_such_module",)
    mod.DYNAMIC_MODULES = "testlib_modules"
    mod.normalise = lambda loader, arguments: [("seen", sorted(arguments))]
    mod.key_for_value = lambda value: ("mine", value) if value == "mine" else None
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    mod.adapter = HubAdapter(mod.__name__)
    return mod


def loader(owner):
    return types.SimpleNamespace(owner=owner, name=f"{owner.__name__}.from_pretrained")


def test_its_hooks_register_as_the_adapter_object(plugin):
    pm = hookspec_manager()
    pm.register(plugin.adapter, name="testlib")
    pm.check_pending()
    [impl] = pm.hook.overmind_key_parts.get_hookimpls()
    assert impl.argnames == ("loader", "arguments")


def test_patch_targets_read_the_specs_at_call_time(plugin):
    targets = plugin.adapter.overmind_patch_targets()
    assert [(t.owner, t.name) for t in targets] == [(Model, "from_pretrained"),
                                                    (Override, "from_pretrained")]
    plugin.SPECS = (Spec(f"{LIB}:Model", subclasses=False),)
    assert [t.owner for t in plugin.adapter.overmind_patch_targets()] == [Model]


def test_a_required_preload_that_is_missing_fails_the_hook(plugin):
    plugin.PRELOAD = ("overmind_hf_no_such_module",)
    with pytest.raises(ImportError):
        plugin.adapter.overmind_patch_targets()


def test_key_parts_only_for_its_own_loaders_and_never_before_the_library_is_imported(plugin, monkeypatch):
    parts = plugin.adapter.overmind_key_parts(loader(Override), {"b": 1, "a": 2})
    assert parts == [("seen", ["a", "b"])]
    assert plugin.adapter.overmind_key_parts(loader(int), {}) is None
    monkeypatch.delitem(sys.modules, LIB)
    assert plugin.adapter.overmind_key_parts(loader(Model), {}) is None


def test_a_call_it_cannot_read_is_left_uncached_with_one_warning(plugin):
    def unreadable(loader, arguments):
        raise KeyError("dtype")

    plugin.normalise = unreadable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Uncacheable):
            plugin.adapter.overmind_key_parts(loader(Model), {})
    [message] = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    assert f"adapter {LIB} (overmind-{LIB}" in message and "Model.from_pretrained" in message
    assert f"Please report this with your {LIB} version" in message


def test_key_for_value_then_the_resolved_revision(plugin):
    class ResolvedRevision(str):
        resolved = "abc123"

    assert plugin.adapter.overmind_key_for_value("mine") == ("mine", "mine")
    resolved = plugin.adapter.overmind_key_for_value(ResolvedRevision("main"))
    assert resolved == ("resolved-revision", "main", "abc123")
    assert plugin.adapter.overmind_key_for_value(3) is None


def test_no_dynamic_modules_no_metadata(plugin):
    assert plugin.adapter.overmind_entry_metadata(Model(), loader(Model)) is None
    assert plugin.adapter.overmind_before_unpickle({}) is None
