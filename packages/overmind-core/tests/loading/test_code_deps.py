"""The user's modules a loader reaches past its key (a local import) are what its entry varies with (loading/code_deps.py).

Fresh processes against one private server, each compared with a plain process: a helper module imported inside
the loader is edited between runs; the next process must get the edited helper's result (a miss, then a hit), never
the earlier one.
"""
from __future__ import annotations

import os
import time

from _support import pythonpath_env
from overmind.loading import code_deps
from overmind.testing import run_fresh

LOADERS = '''
def load():
    import dep_helper
    return dep_helper.build()


def load_from(name):
    import importlib
    return importlib.import_module(name).build()
'''

HELPER = '''
import torch
def build():
    return {{"value": {value}, "weights": torch.full((4,), {value}.0)}}
'''

SCRIPT = '''
import os, overmind
from overmind.testing import report
import dep_loaders
fn = getattr(dep_loaders, os.environ["LOADER"])
args = (os.environ["ARG"],) if os.environ.get("ARG") else ()
out = overmind.load(fn, *args) if os.environ["VIA"] == "overmind" else fn(*args)
import sys
report({"value": out["value"], "weights": out["weights"].tolist(), "imported": "dep_helper" in sys.modules})
'''


def _write(path, text: str) -> None:
    path.write_text(text)
    past = time.time() - 30  # well before the next process starts (its start time is read to the second)
    os.utime(path, (past, past))


def _entries(env) -> int:
    return run_fresh("import overmind\nfrom overmind.testing import report\n"
                     "report(len(overmind.cache_info().entries))", env=env)


def _run(env, via, **extra):
    return run_fresh(SCRIPT, env={**env, "VIA": via, **extra})


def test_an_edited_helper_reached_by_a_local_import_is_a_miss_in_the_next_process(tmp_path, overmind_runtime):
    (tmp_path / "dep_loaders.py").write_text(LOADERS)
    _write(tmp_path / "dep_helper.py", HELPER.format(value=1))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), pythonpath_env()]), "OVERMIND_RUNTIME_DIR": overmind_runtime,
           "LOADER": "load"}
    assert _run(env, "plain")["value"] == 1
    first, second = _run(env, "overmind"), _run(env, "overmind")
    assert first == {"value": 1, "weights": [1.0] * 4, "imported": True}
    assert second == {"value": 1, "weights": [1.0] * 4, "imported": False}  # a hit: the loader did not run
    assert _entries(env) == 2  # the call's marker and the variant of this helper

    _write(tmp_path / "dep_helper.py", HELPER.format(value=2))
    plain = _run(env, "plain")
    assert plain["value"] == 2
    assert _run(env, "overmind") == plain  # a miss: the loader ran and imported the edited helper
    assert _run(env, "overmind") == dict(plain, imported=False)  # then a hit
    assert _entries(env) == 3  # a second variant: the edited helper's

    _write(tmp_path / "dep_helper.py", HELPER.format(value=1))  # back to the first content: its variant serves
    got = _run(env, "overmind")
    assert got == {"value": 1, "weights": [1.0] * 4, "imported": False}  # a hit: the loader did not import it
    assert _entries(env) == 3


def test_a_module_imported_by_name_through_importlib_is_a_dependency(tmp_path, overmind_runtime):
    (tmp_path / "dep_loaders.py").write_text(LOADERS)
    _write(tmp_path / "dep_helper.py", HELPER.format(value=5))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), pythonpath_env()]), "OVERMIND_RUNTIME_DIR": overmind_runtime,
           "LOADER": "load_from", "ARG": "dep_helper"}
    assert _run(env, "overmind")["value"] == 5
    _write(tmp_path / "dep_helper.py", HELPER.format(value=6))
    assert _run(env, "overmind")["value"] == 6


def test_local_imports_are_read_from_the_code():
    def loader():
        import json  # noqa: F401
        from os import path  # noqa: F401

        def inner():
            import helper_module  # noqa: F401

    assert {"json", "os", "os.path", "helper_module"} <= code_deps._local_imports(loader)


def test_a_file_changed_after_the_process_started_is_not_a_dependency_it_can_vouch_for(tmp_path):
    import sys

    path = tmp_path / "dep_changed.py"
    path.write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import dep_changed  # noqa: F401

        def loader():
            import dep_changed  # noqa: F401, F811

        assert code_deps.state(code_deps.PREFIX + os.path.realpath(path)) is None  # written after this process began
        names, reason = code_deps.dependencies(loader, code_deps.modules_now(), time.time_ns())
        assert names == [] and "changed on disk" in reason
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("dep_changed", None)


def test_modules_an_adapter_keys_itself_are_no_dependency(tmp_path, monkeypatch):
    import sys

    from overmind import adapter

    (tmp_path / "kit_keyed_pkg").mkdir()
    (tmp_path / "kit_keyed_pkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "plain_user_mod.py").write_text("Y = 2\n")
    past = time.time() - 30
    for p in (tmp_path / "kit_keyed_pkg" / "__init__.py", tmp_path / "plain_user_mod.py"):
        os.utime(p, (past, past))
    monkeypatch.syspath_prepend(str(tmp_path))
    from overmind.adapters import discovery

    monkeypatch.setattr(discovery, "code_keyed_prefixes", set())
    adapter.code_keyed_by_adapter("kit_keyed_pkg")
    before = code_deps.modules_now()
    try:
        import kit_keyed_pkg  # noqa: F401
        import plain_user_mod  # noqa: F401

        names, reason = code_deps.dependencies(lambda: None, before, time.time_ns())
        assert reason is None
        assert names == [code_deps.PREFIX + os.path.realpath(tmp_path / "plain_user_mod.py")]
    finally:
        sys.modules.pop("kit_keyed_pkg", None)
        sys.modules.pop("plain_user_mod", None)
