"""A patch target the installed library version does not define is skipped quietly (one debug line on the
``overmind`` logger); one that exists but cannot be patched still warns, naming the adapter, the target and the
versions. (diffusers 0.35 has no ``AutoPipelineForText2Audio``: that is a version difference, not a fault, and
under ``OVERMIND_STRICT=1`` a warning there would take the whole diffusers adapter down.)"""
from __future__ import annotations

import logging
import sys
import textwrap
import types
import warnings

import pytest

from overmind import adapter
from overmind.fallback import CacheBypassed, OvermindWarning


@pytest.fixture
def verlib(monkeypatch, tmp_path):
    """A package ``verlib`` on sys.path: ``verlib.models`` defines ``Loader``; ``verlib.broken`` exists but
    imports a module that does not."""
    pkg = tmp_path / "verlib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(textwrap.dedent("""
        class Loader:
            @classmethod
            def load(cls):
                return cls()

            def save(self):
                return None
    """))
    (pkg / "broken.py").write_text("import verlib_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "verlib"
    for name in [m for m in sys.modules if m == "verlib" or m.startswith("verlib.")]:
        del sys.modules[name]


def _collect(specs, caplog):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="overmind"):
        warnings.simplefilter("always")
        targets = adapter.collect("verlib", specs)
    messages = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    debug = [r.getMessage() for r in caplog.records if r.name == "overmind" and r.levelno == logging.DEBUG]
    return targets, messages, debug


@pytest.mark.parametrize("where, attr, why", [
    ("verlib.models:LoaderOfANewerVersion", "load", "no LoaderOfANewerVersion in verlib.models"),
    ("verlib.models:Loader", "load_of_a_newer_version", "no load_of_a_newer_version on Loader"),
    ("verlib.newer_module:Loader", "load", "no module verlib.newer_module"),
    ("verlib.models:Loader.Nested", "load", "no Nested in"),
])
def test_a_target_this_version_does_not_define_is_skipped_with_a_debug_line(verlib, caplog, monkeypatch, where,
                                                                             attr, why):
    monkeypatch.setenv("OVERMIND_STRICT", "1")  # quiet means no warning, so strict mode raises nothing either
    targets, messages, debug = _collect([adapter.Spec(where, attr), adapter.Spec("verlib.models:Loader", "load")], caplog)
    assert messages == []
    assert [(t.owner.__qualname__, t.name) for t in targets] == [("Loader", "load")]
    [line] = [d for d in debug if where.replace(":", ".") in d]
    assert "adapter verlib (overmind-verlib not installed, verlib not installed)" in line
    assert f"{where.replace(':', '.')}.{attr} is not defined in this version" in line and why in line


def test_a_target_that_exists_but_is_no_classmethod_warns(verlib, caplog):
    targets, messages, debug = _collect([adapter.Spec("verlib.models:Loader", "save"),
                                         adapter.Spec("verlib.models:Loader", "load")], caplog)
    [message] = messages
    assert "adapter verlib" in message and "cannot patch verlib.models.Loader.save" in message
    assert "not a classmethod" in message
    assert [t.name for t in targets] == ["load"] and not [d for d in debug if "Loader.save" in d]


def test_a_module_that_exists_but_fails_to_import_warns(verlib, caplog):
    targets, messages, _ = _collect([adapter.Spec("verlib.broken:Loader"), adapter.Spec("verlib.models:Loader", "load")],
                                    caplog)
    [message] = messages
    assert "cannot patch verlib.broken.Loader.from_pretrained" in message
    assert "ModuleNotFoundError" in message and "verlib_dependency_that_is_not_installed" in message
    assert [t.name for t in targets] == ["load"]


def test_under_strict_a_target_that_cannot_be_patched_raises(verlib, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    with pytest.raises(CacheBypassed, match="not a classmethod"):
        adapter.collect("verlib", [adapter.Spec("verlib.models:Loader", "save")])


def test_a_library_module_whose_attribute_lookup_fails_warns(monkeypatch, caplog):
    class Lazy(types.ModuleType):
        def __getattr__(self, name):  # what diffusers' lazy modules do when an optional dependency is broken
            raise RuntimeError(f"Failed to import {name}: a dependency is broken")

    monkeypatch.setitem(sys.modules, "lazylib", Lazy("lazylib"))
    targets, messages, _ = _collect([adapter.Spec("lazylib:Pipeline")], caplog)
    assert targets == [] and len(messages) == 1 and "RuntimeError: Failed to import Pipeline" in messages[0]
