"""Post-import hooks: a callback runs once, right after the watched module finishes importing."""
from __future__ import annotations

import sys

from overmind.adapters import importwatch


def test_callback_runs_after_the_module_is_fully_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "om_watched_lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 41\nfrom . import part\n")
    (pkg / "part.py").write_text("EXTRA = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    importwatch.when_imported("om_watched_lib", lambda m: seen.append((m.VALUE + m.part.EXTRA, m.__loader__)))
    assert seen == [] and importwatch.pending().get("om_watched_lib") == 1
    import om_watched_lib  # noqa: F401  (importing it is what the test watches)

    assert seen[0][0] == 42
    assert type(seen[0][1]).__name__ != "_NotifyingLoader"  # the real loader is back on the module
    assert "om_watched_lib" not in importwatch.pending()
    importwatch.when_imported("om_watched_lib", lambda m: seen.append("now"))  # already imported: at once
    assert seen[-1] == "now"
    monkeypatch.delitem(sys.modules, "om_watched_lib")
    monkeypatch.delitem(sys.modules, "om_watched_lib.part")


def test_cancelled_callbacks_do_not_run(tmp_path, monkeypatch):
    (tmp_path / "om_watched_other.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    cb = seen.append
    importwatch.when_imported("om_watched_other", cb)
    importwatch.cancel(cb)
    import om_watched_other  # noqa: F401

    assert seen == []
    monkeypatch.delitem(sys.modules, "om_watched_other")


def test_a_submodule_callback_runs_when_that_submodule_is_imported(tmp_path, monkeypatch):
    """A library imports its costly submodule only on use (diffusers' ``auto_pipeline``): the callback waits
    for that import, however it comes (a lazy ``__getattr__`` here), and the package's own import fires nothing."""
    pkg = tmp_path / "om_watched_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import importlib\n"
        "def __getattr__(name):\n"
        "    if name == 'Costly':\n"
        "        return importlib.import_module('.costly', __name__).Costly\n"
        "    raise AttributeError(name)\n")
    (pkg / "costly.py").write_text("class Costly:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    importwatch.when_imported("om_watched_pkg.costly", lambda m: seen.append(m.Costly.__name__))
    import om_watched_pkg

    assert seen == [] and "om_watched_pkg.costly" not in sys.modules
    assert om_watched_pkg.Costly.__name__ == "Costly"
    assert seen == ["Costly"] and "om_watched_pkg.costly" not in importwatch.pending()
    assert type(sys.modules["om_watched_pkg.costly"].__loader__).__name__ != "_NotifyingLoader"
    monkeypatch.delitem(sys.modules, "om_watched_pkg")
    monkeypatch.delitem(sys.modules, "om_watched_pkg.costly")
