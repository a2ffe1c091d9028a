"""The declared version ranges say exactly what CI tests: each adapter's ``tested`` range and each
companion library's tested range (``overmind.cli.compatibility.COMPANIONS``) starts at the oldest lane's release
(``scripts/requirements-oldest.txt``) and ends before the release after the newest lane's
(``scripts/requirements.txt``); a library that only the timm lane installs (``scripts/requirements-timm.txt``)
has that lane's release at both ends. Bump a pin, and this test names the range to bump with it. ``overmind doctor``
reports the installed versions against those ranges."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from _support.adapter_packages import adapter_pyprojects
from overmind.cli import compatibility

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            req = Requirement(line)
            pins[req.name.lower()] = Version(str(req.specifier).removeprefix("=="))
    return pins


def _lanes() -> tuple[dict[str, Version], dict[str, Version]]:
    """(oldest, newest) pins; torch from scripts/setup, stable-fast from the wheel both lanes install."""
    oldest, newest = _pins(ROOT / "scripts/requirements-oldest.txt"), _pins(ROOT / "scripts/requirements.txt")
    # a library only the timm lane installs (scripts/requirements-timm.txt) is both ends of its range
    timm_lane = {name: version for name, version in _pins(ROOT / "scripts/requirements-timm.txt").items()
                 if name not in oldest and name not in newest}
    oldest, newest = {**timm_lane, **oldest}, {**timm_lane, **newest}
    [torch] = re.findall(r"^torch_pin=torch==([\d.]+)", (ROOT / "scripts/setup").read_text(), re.M)
    wheels = sorted((ROOT.parent / "shared" / "wheels").glob("stable_fast-*.whl"))
    extra = {"torch": Version(torch)}
    if wheels:
        extra["stable-fast"] = Version(wheels[-1].name.split("-")[1])
    return {**extra, **oldest}, {**extra, **newest}


def _extra(extra: str) -> dict[str, SpecifierSet]:
    ranges = {}
    for pyproject in adapter_pyprojects().values():
        project = pyproject["project"]
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            ranges[f"{req.name.lower()} ({project['name']})"] = req.specifier
    return ranges


# An upper bound in an adapter's instruments extra turns the adapter off for every later release: one exists
# only for a release known to break the adapter, listed here with the reason (none is known today).
KNOWN_BREAKS: dict[str, str] = {}


@pytest.mark.parametrize("label", sorted(_extra("instruments")))
def test_instruments_bound_from_below_only_unless_a_release_is_known_to_break(label):
    needs, tested = _extra("instruments")[label], _extra("tested")[label]
    upper = [s for s in needs if s.operator in ("<", "<=", "==", "~=")]
    assert not upper or label in KNOWN_BREAKS, (
        f"{label}: instruments {needs} has an upper bound: a release past it turns the adapter off. Drop it (a newer "
        f"release is checked at activation by overmind.adapters.self_check), or name the release that breaks and "
        f"why in KNOWN_BREAKS")
    assert [s for s in needs if s.operator == ">="] == [s for s in tested if s.operator == ">="] or \
        label.startswith("torch"), f"{label}: instruments {needs} and tested {tested} should start at one release"


def _declared() -> dict[str, SpecifierSet]:
    return {**_extra("tested"), **{f"{name} (companion)": SpecifierSet(spec)
                                 for name, spec in compatibility.COMPANIONS.items()}}


@pytest.mark.parametrize("label", sorted(_declared()))
def test_each_range_is_exactly_the_two_lanes(label):
    spec = _declared()[label]
    name = label.split(" ")[0]
    oldest, newest = _lanes()
    if name not in oldest or name not in newest:
        pytest.skip(f"{name} is not installed by both lanes here") if name == "stable-fast" else pytest.fail(
            f"{name} has a declared range but is not pinned in both scripts/requirements*.txt")
    old, new = oldest[name], newest[name]
    lower = [Version(s.version) for s in spec if s.operator == ">="]
    upper = [Version(s.version) for s in spec if s.operator == "<"]
    assert len(lower) == 1 and lower[0] in (Version(f"{old.major}.{old.minor}"), old), (
        f"{label}: {spec} should start at the oldest lane's {name} {old} (>={old.major}.{old.minor})")
    assert upper == [Version(f"{new.major}.{new.minor + 1}")], (
        f"{label}: {spec} should end before the release after the newest lane's {name} {new} "
        f"(<{new.major}.{new.minor + 1})")
    assert spec.contains(old) and spec.contains(new)


def test_doctor_lists_the_installed_versions_against_the_tested_ranges():
    import torch
    import transformers

    out = subprocess.run([sys.executable, "-m", "overmind", "doctor", "--brief"], capture_output=True, text=True,
                         timeout=300).stdout
    lines = {line.split()[2]: line for line in out.splitlines() if line.split()[1:2] == ["library"]}
    tested = ",".join(sorted(map(str, _declared()["transformers (overmind-transformers)"]), reverse=True))
    assert lines["transformers"].split()[:4] == ["ok", "library", "transformers", transformers.__version__]
    assert f"(tested: {tested})" in lines["transformers"]
    assert lines["torch"].startswith("ok") and torch.__version__ in lines["torch"]
    assert {"diffusers", "huggingface-hub", "tokenizers", "accelerate"} <= set(lines)
    assert all(line.startswith("ok") for line in lines.values()), out


def test_a_version_outside_its_tested_range_is_a_warning_with_the_range_to_install(monkeypatch):
    rows = [compatibility.LibraryVersion("transformers", "4.46.0", ">=4.57,<5.25", "overmind-transformers tested"),
            compatibility.LibraryVersion("torch", "2.13.0+cpu", ">=2.13,<2.14", "overmind (companion)"),
            compatibility.LibraryVersion("accelerate", None, ">=1.15,<1.16", "overmind (companion)")]
    assert [r.in_range for r in rows] == [False, True, None]
    monkeypatch.setattr(compatibility, "library_versions", lambda: rows)
    old, torch_line = compatibility.checks()  # a library not installed gets no line
    assert (old.name, old.state, torch_line.state) == ("library transformers", "warn", "ok")
    assert "4.46.0 is outside the tested range >=4.57,<5.25 (overmind-transformers tested)" in old.detail
    assert 'pip install "transformers>=4.57,<5.25"' in old.fix
