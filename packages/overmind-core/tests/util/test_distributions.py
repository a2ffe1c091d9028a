"""overmind._util.distributions finds what importlib.metadata finds (entry points, versions, requirements, files), sees a
package installed or removed since its last look, and hands the cases it does not read itself to
importlib.metadata."""
from __future__ import annotations

import os
import sys
import zipfile
from importlib import metadata

import pytest

from overmind._util import distributions


def _theirs_unique() -> list[metadata.Distribution]:
    seen, out = set(), []
    for d in metadata.distributions():
        key = distributions.normalize(d.metadata["Name"] or "")
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


@pytest.mark.parametrize("group", ["overmind.adapters", "console_scripts", "pytest11", "no.such.group"])
def test_entry_points_are_importlib_metadatas_in_its_order(group):
    ours = [(ep.name, ep.value, ep.dist.name) for ep in distributions.entry_points(group)]
    theirs = [(ep.name, ep.value, ep.dist.metadata["Name"]) for ep in metadata.entry_points(group=group)]
    assert ours == theirs


def test_every_distribution_reads_as_importlib_metadata_reads_it():
    dists = _theirs_unique()
    assert len(dists) > 20
    for theirs in dists:
        name = theirs.metadata["Name"]
        ours = distributions.distribution(name)
        assert ours is not None, name
        assert (ours.name, ours.version, ours.requires) == (name, theirs.version, theirs.requires), name
        files = theirs.files
        assert ours.file_parts() == (None if files is None else [tuple(f.parts) for f in files]), name
        assert distributions.version(name) == metadata.version(name)
    assert distributions.distribution("no-such-distribution-anywhere") is None
    assert distributions.version("no-such-distribution-anywhere") is None


def test_a_name_is_found_in_any_spelling_pep_503_equates():
    d = distributions.distribution("overmind-core")
    assert d is not None and d.name == "overmind-core"
    assert distributions.distribution("Overmind_Core").path == distributions.distribution("overmind.core").path == d.path


def _dist(folder, name, version, eps=""):
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f'Requires-Dist: lib>=1; extra == "instruments"\n\nA description.\n')
    (info / "entry_points.txt").write_text(f"[overmind.test-installed]\n{eps}\n" if eps else "")
    return info


def _moved_on(folder):
    """A package manager takes longer than one tick of the file system's clock; the test does not wait."""
    st = os.stat(folder)
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_package_installed_upgraded_or_removed_since_the_last_look_is_seen(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    group = "overmind.test-installed"
    assert distributions.version("demo-pkg") is None and distributions.entry_points(group) == []

    v1 = _dist(tmp_path, "demo-pkg", "1.0", "demo = demo_pkg.plugin")
    assert distributions.version("demo-pkg") == "1.0"
    assert [(ep.name, ep.value) for ep in distributions.entry_points(group)] == [("demo", "demo_pkg.plugin")]

    # an upgrade: the new folder beside the old, then the old one gone
    _dist(tmp_path, "demo-pkg", "2.0", "demo = demo_pkg.plugin2")
    for f in v1.iterdir():
        f.unlink()
    v1.rmdir()
    _moved_on(tmp_path)
    assert distributions.version("demo-pkg") == "2.0"
    assert [ep.value for ep in distributions.entry_points(group)] == ["demo_pkg.plugin2"]
    assert [str(r) for r in distributions.distribution("demo-pkg").requires] == ['lib>=1; extra == "instruments"']

    # a file rewritten inside a folder that stays: read afresh on each look
    (tmp_path / "demo_pkg-2.0.dist-info" / "entry_points.txt").write_text(f"[{group}]\nother = demo_pkg.other\n")
    assert [ep.name for ep in distributions.entry_points(group)] == ["other"]

    for f in (tmp_path / "demo_pkg-2.0.dist-info").iterdir():
        f.unlink()
    (tmp_path / "demo_pkg-2.0.dist-info").rmdir()
    _moved_on(tmp_path)
    assert distributions.version("demo-pkg") is None and distributions.entry_points(group) == []


def test_the_first_of_two_distributions_of_one_name_on_sys_path_wins(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _dist(first, "twice-pkg", "1.0", "twice = first.plugin")
    _dist(second, "twice-pkg", "2.0", "twice = second.plugin")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    assert distributions.version("twice-pkg") == "1.0" == metadata.version("twice-pkg")
    ours = [ep.value for ep in distributions.entry_points("overmind.test-installed")]
    assert ours == [ep.value for ep in metadata.entry_points(group="overmind.test-installed")] == ["first.plugin"]


def test_a_zip_on_sys_path_is_read_by_importlib_metadata(tmp_path, monkeypatch):
    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_pkg-3.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped-pkg\nVersion: 3.0\n")
        z.writestr("zipped_pkg-3.0.dist-info/entry_points.txt", "[overmind.test-installed]\nz = zipped_pkg.plugin\n")
    monkeypatch.syspath_prepend(str(archive))
    assert distributions._index() is None
    assert distributions.version("zipped-pkg") == "3.0"
    eps = distributions.entry_points("overmind.test-installed")
    assert [(ep.name, ep.value, ep.dist.name) for ep in eps] == [("z", "zipped_pkg.plugin", "zipped-pkg")]


def test_a_finder_that_finds_distributions_of_its_own_hands_the_search_to_importlib_metadata(monkeypatch):
    class Extra(metadata.DistributionFinder):
        def find_spec(self, *args, **kwargs):
            return None

        def find_distributions(self, context=None):
            return iter(())

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Extra()])
    assert distributions._index() is None
    assert ([ep.name for ep in distributions.entry_points("overmind.adapters")]
            == [ep.name for ep in metadata.entry_points(group="overmind.adapters")])
    assert distributions.version("overmind-core") == metadata.version("overmind-core")


def test_an_entry_point_loads_its_module_or_its_attribute():
    ep = distributions.EntryPoint("x", "os.path:join", distributions.distribution("overmind-core"))
    assert ep.load() is os.path.join
    assert distributions.EntryPoint("x", "os.path", ep.dist).load() is os.path
    with pytest.raises(ValueError, match="names no module"):
        distributions.EntryPoint("x", "not a module!", ep.dist).load()
