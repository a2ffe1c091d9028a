"""code_identity.distribution_of names installed code by what importlib.metadata says installed it, for every
top-level module of every installed distribution (it reads the records through overmind._util.distributions, without
importlib.metadata's email parser: the same answer is the point, a different one would change keys)."""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import sys

import pytest

from overmind.keys import code_identity


def _importlib_answer(top: str) -> tuple | None:
    dists = sorted(set(metadata.packages_distributions().get(top, ())))
    return tuple((d, metadata.version(d)) for d in dists) or None


def test_every_installed_top_level_module_gets_importlib_metadatas_distribution_and_version():
    checked = 0
    for top in sorted(metadata.packages_distributions()):
        if not top.isidentifier() or top.startswith("_") or top.startswith("overmind") or top in sys.stdlib_module_names:
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec else None
        if not origin or not code_identity.under_installed_root(origin):
            continue  # an editable install or a namespace package: keyed by its code, not by a version
        # distribution_of looks the module up in sys.modules; a module object with that file stands in for it
        module = type(sys)(top)
        module.__file__ = origin
        code_identity.distribution_of.cache_clear()
        saved = sys.modules.get(top)
        sys.modules[top] = saved or module
        try:
            got = code_identity.distribution_of(top)
        finally:
            if saved is None:
                del sys.modules[top]
        assert got == _importlib_answer(top), top
        checked += 1
    assert checked >= 50  # the venv has torch, diffusers, transformers and their dependencies


def _install(folder, version: str) -> None:
    info = folder / f"omfake-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: omfake\nVersion: {version}\n\nbody\n")
    (info / "top_level.txt").write_text("omfake\n")


def test_a_top_levels_distribution_is_remembered_until_something_is_installed_or_removed(tmp_path, monkeypatch):
    import shutil

    _install(tmp_path, "1.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert code_identity._versions_providing("omfake") == (("omfake", "1.0"),)

    def unread(top):
        raise AssertionError("read again although nothing was installed or removed")

    with monkeypatch.context() as m:
        m.setattr(code_identity, "_distributions_providing", unread)
        assert code_identity._versions_providing("omfake") == (("omfake", "1.0"),)
    shutil.rmtree(tmp_path / "omfake-1.0.dist-info")  # an upgrade: the folder on sys.path changes
    _install(tmp_path, "2.0")
    assert code_identity._versions_providing("omfake") == (("omfake", "2.0"),)


def test_a_distribution_declaring_no_top_level_modules_is_found_by_its_files_without_reading_every_record(
        tmp_path, monkeypatch):
    # What a maturin-built wheel (tokenizers) installs: no top_level.txt, its package listed in RECORD.
    for name, files in (("omrust", ["omrust/__init__.py", "omrust/omrust.abi3.so"]), ("omdata", ["omdata.json"])):
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text("".join(f"{f},sha256=x,1\n" for f in files) + f"{name}-1.0.dist-info/RECORD,,\n")
    (tmp_path / "omrust").mkdir()
    (tmp_path / "omrust" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sorted(set(metadata.packages_distributions()["omrust"])) == ["omrust"], "importlib.metadata infers it"

    def every_record():
        raise AssertionError("every distribution's record was read")

    monkeypatch.setattr(code_identity, "_packages_distributions", every_record)
    assert code_identity._distributions_providing("omrust") == ["omrust"]
    with pytest.raises(AssertionError, match="every distribution's record"):
        code_identity._distributions_providing("omdata")  # no package of that name in its files: ask them all
