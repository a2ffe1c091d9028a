"""Lazy targets (``Spec(lazy=True)`` and ``overmind_patch_later``) in the core, with a library of two costly
submodules: ``activate()`` imports neither; each is patched when the user imports it, whichever comes first and
however many there are; a load through it is cached; ``deactivate()`` restores every original, and an import after
it patches nothing."""
from __future__ import annotations

import sys
from importlib import metadata

import pytest

from overmind import activation
from overmind.adapter import Spec, collect, hookimpl, waiting_modules
from overmind.adapters import discovery, patching
from overmind.client.connection import get_client

LIB = "om_lazy_lib"
SOURCE = '''
class {name}:
    @classmethod
    def from_pretrained(cls, n):
        return {{"cls": cls.__name__, "n": n}}
'''
SPECS = (Spec(f"{LIB}.base:Base"), Spec(f"{LIB}.first:First", lazy=True), Spec(f"{LIB}.second:Second", lazy=True))


class LazyAdapter:
    @hookimpl
    def overmind_patch_targets(self):
        return collect("lazylib", SPECS)

    @hookimpl
    def overmind_patch_later(self):
        return waiting_modules(SPECS)


@pytest.fixture
def lazylib(tmp_path, monkeypatch, overmind_runtime):
    pkg = tmp_path / LIB
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import base\n")
    for module, name in (("base", "Base"), ("first", "First"), ("second", "Second")):
        (pkg / f"{module}.py").write_text(SOURCE.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    names = {ep.name for ep in metadata.entry_points(group=discovery.GROUP)}
    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", ",".join(sorted(names)))
    activation.reset()
    import om_lazy_lib  # noqa: F401

    discovery.register_adapter("lazylib", LazyAdapter())
    yield
    activation.reset()
    for m in [m for m in sys.modules if m == LIB or m.startswith(LIB + ".")]:
        del sys.modules[m]


def test_each_later_module_is_patched_when_imported_in_any_order(lazylib):
    activation.activate(strict=True)
    base = sys.modules[f"{LIB}.base"].Base
    assert patching.is_patched(base, "from_pretrained")
    assert f"{LIB}.first" not in sys.modules and f"{LIB}.second" not in sys.modules
    from om_lazy_lib.second import Second  # the second first: each callback must patch its own module's targets

    assert patching.is_patched(Second, "from_pretrained")
    from om_lazy_lib.first import First

    assert patching.is_patched(First, "from_pretrained")
    assert First.from_pretrained(3) == {"cls": "First", "n": 3}
    before = get_client().ls()
    assert First.from_pretrained(3) == {"cls": "First", "n": 3}
    after = get_client().ls()
    assert len(after) == len(before) >= 1  # nothing new published: the second call was a hit
    assert sum(e["hits"] for e in after) == sum(e["hits"] for e in before) + 1
    originals = {c: vars(c)["from_pretrained"] for c in (base, First, Second)}
    activation.deactivate()
    for cls, patched in originals.items():
        assert not patching.is_patched(cls, "from_pretrained")
        assert vars(cls)["from_pretrained"] is not patched
        assert vars(cls)["from_pretrained"].__func__.__qualname__ == f"{cls.__name__}.from_pretrained"


def test_an_import_after_deactivate_patches_nothing(lazylib):
    activation.activate(strict=True)
    activation.deactivate()
    from om_lazy_lib.first import First

    assert not patching.is_patched(First, "from_pretrained")
    activation.activate(strict=True)  # activating again: First is imported now, patched at once
    assert patching.is_patched(First, "from_pretrained")
