"""An adapter on a library release newer than its ``tested`` range stays on when it proves itself, and is turned
off, with one warning naming the library, the version and what failed, when it does not.

A probe library (``probe-lib`` 1.5) and its adapter are real distributions written into a folder on
``PYTHONPATH``: the adapter needs ``probe-lib>=1`` (``instruments``) and was tested with ``>=1,<1.5`` (``tested``).
Each case runs in fresh processes against a private server, as a user's program would: ``activate()``, import the
library, load. What the user sees must be what the plain call gives (values, no warning, the random generators'
state), and the cache serves the load whenever the check passes.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh

pytest.importorskip("torch")

LIBRARY = '''
import torch

class Weights:
    def __init__(self, tensor, note):
        self.tensor = tensor
        self.note = note

class Model:
    @classmethod
    def load({params}):
        return Weights(torch.load({path}), "loaded")
'''

ADAPTER = '''
import os
from overmind.adapter import SelfCheck, Spec, collect, hookimpl

@hookimpl
def overmind_patch_targets():
    return collect("probe", [Spec("probe_lib:Model", "load", subclasses=False)])

@hookimpl
def overmind_self_check():
    return SelfCheck(relies_on={"load": ("path", "**")}, sample=sample)

def sample():
    with open(os.environ["PROBE_SAMPLES"], "a") as f:
        f.write("built\\n")
    import torch, probe_lib
    return probe_lib.Weights(torch.randn(8), "sample")  # draws: the user's generator must not move

if os.environ.get("PROBE_LOSSY"):  # a reducer that drops a field: the round trip differs
    @hookimpl
    def overmind_reducers():
        import probe_lib
        return {probe_lib.Weights: lambda w: (probe_lib.Weights, (w.tensor, "lost"))}
'''

USER = '''
import json, os, random, warnings
import torch
import overmind
from overmind.testing import report

overmind.activate()
torch.manual_seed(3)
before = torch.get_rng_state().clone(), random.getstate()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import probe_lib
    from overmind.adapters import discovery, patching
    state = discovery.states()["probe"]
    w = probe_lib.Model.load(os.environ["PROBE_PATH"])
rng_kept = torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
info = overmind.cache_info()
report({"status": state.status, "reason": state.reason, "untested": state.untested,
        "self_check": state.self_check.detail if state.self_check else None,
        "patched": patching.is_patched(probe_lib.Model, "load"), "rng_kept": rng_kept,
        "warnings": [f"{type(m.message).__name__}: {m.message}" for m in caught],
        "value": w.tensor.tolist(), "note": w.note, "entries": len(info.entries),
        "hits": sum(e.hits for e in info.entries)})
'''


def _dist(site, name: str, version: str, requires: list[str] = (), entry_points: str = "", top: str = "") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    if top:
        (info / "top_level.txt").write_text(top + "\n")
    (info / "RECORD").write_text("")


@pytest.fixture
def probe(tmp_path, overmind_runtime):
    """Write the probe library and its adapter; return a runner of the user's script and the samples log."""
    import torch

    site = tmp_path / "site"
    site.mkdir()
    weights = tmp_path / "weights.pt"
    torch.save(torch.arange(6, dtype=torch.float32), weights)
    samples = tmp_path / "samples.log"

    def write(tested: str = ">=1,<1.5", params: str = "cls, path, **kwargs", lossy: bool = False):
        for child in site.iterdir():
            if child.is_dir():
                for f in child.iterdir():
                    f.unlink()
                child.rmdir()
            else:
                child.unlink()
        (site / "probe_lib.py").write_text(LIBRARY.format(params=params, path=params.split(", ")[1]))
        (site / "probe_adapter.py").write_text(ADAPTER)
        _dist(site, "probe-lib", "1.5", top="probe_lib")
        _dist(site, "probe-adapter", "0.1", ['probe-lib>=1; extra == "instruments"',
                                             f'probe-lib{tested}; extra == "tested"'],
              "[overmind.adapters]\nprobe = probe_adapter\n")
        return lossy

    def run(lossy: bool = False, cache: str = "cache") -> dict:
        env = {"PYTHONPATH": os.pathsep.join([str(site), pythonpath_env()]), "PROBE_PATH": str(weights),
               "PROBE_SAMPLES": str(samples), "XDG_CACHE_HOME": str(tmp_path / cache),
               "OVERMIND_DISABLED_ADAPTERS": _others_blocked()}
        if lossy:
            env["PROBE_LOSSY"] = "1"
        return run_fresh(USER, env=env)

    def built() -> int:
        return len(samples.read_text().splitlines()) if samples.exists() else 0

    return write, run, built


def _others_blocked() -> str:
    from importlib import metadata

    return ",".join(sorted({ep.name for ep in metadata.entry_points(group="overmind.adapters")} - {"probe"}))


PLAIN = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_an_untested_release_that_passes_is_served_and_checked_once_per_environment(probe):
    write, run, built = probe
    write()
    first = run()
    assert first["untested"] == [["probe-lib", "1.5", ">=1,<1.5"]]
    assert (first["status"], first["patched"]) == ("loaded", True)
    assert "1 loader fit" in first["self_check"] and "Weights came back equal" in first["self_check"]
    assert (first["value"], first["note"], first["warnings"], first["rng_kept"]) == (PLAIN, "loaded", [], True)
    assert built() == 1
    second = run()
    assert (second["value"], second["note"], second["warnings"], second["rng_kept"]) == (PLAIN, "loaded", [], True)
    assert second["hits"] == 1 and second["entries"] == 1, "a passing adapter's loads are served"
    assert second["self_check"].endswith("(remembered)") and built() == 1, "the round trip runs once"
    run(cache="another-environment")
    assert built() == 2, "a new environment (another cache home) checks again"


def test_a_release_within_the_tested_range_is_not_checked(probe):
    write, run, built = probe
    write(tested=">=1,<2")
    out = run()
    assert (out["untested"], out["self_check"], out["patched"], out["warnings"]) == ([], None, True, [])
    assert built() == 0


def test_a_sample_that_comes_back_different_turns_the_adapter_off_with_one_warning(probe):
    write, run, built = probe
    write()
    out = run(lossy=True)
    assert (out["status"], out["patched"], out["entries"]) == ("failed", False, 0)
    assert (out["value"], out["note"], out["rng_kept"]) == (PLAIN, "loaded", True), "the plain loader's result"
    [warning] = out["warnings"]
    assert warning.startswith("OvermindWarning: overmind: adapter probe (probe-adapter) is off: probe-lib 1.5 "
                              "(tested: >=1,<1.5) is outside its tested range and its self-check failed: ")
    assert "a Weights came back from the entry codec different from itself" in warning
    assert 'Install "probe-lib>=1,<1.5" for a tested set, or upgrade probe-adapter.' in warning


def test_a_loader_whose_signature_changed_is_left_plain_and_named(probe):
    write, run, built = probe
    write(params="cls, where")
    out = run()
    assert (out["status"], out["patched"], out["entries"], out["value"]) == ("failed", False, 0, PLAIN)
    [warning] = out["warnings"]
    assert "no loader it patches takes the parameters it reads: Model.load takes no path, **kwargs" in warning
    assert built() == 0, "the sample is not built for an adapter whose loaders do not fit"


def test_doctor_warns_for_an_untested_adapter_with_its_self_check(probe, tmp_path):
    write, run, built = probe
    write()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), pythonpath_env()]),
           "PROBE_SAMPLES": str(tmp_path / "samples.log"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "OVERMIND_DISABLED_ADAPTERS": _others_blocked()}
    out = subprocess.run([sys.executable, "-m", "overmind", "doctor", "--json"], env=env, capture_output=True,
                         text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    line = checks["adapter probe"]
    assert line["state"] == "warn", line
    assert line["detail"].startswith("probe-adapter: active on untested probe-lib 1.5 (tested: >=1,<1.5); "
                                     "self-check passed: 1 loader fit"), line
    assert 'pip install "probe-lib>=1,<1.5"' in line["fix"]
    write(tested=">=1,<2")
    out = subprocess.run([sys.executable, "-m", "overmind", "doctor", "--json"], env=env, capture_output=True,
                         text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["adapter probe"]["state"] == "ok"
    assert all(c["state"] != "ok" for name, c in checks.items()
               if name.startswith("adapter ") and "skipped" in c["detail"]), "a skipped adapter is never ok"


def test_the_remembered_result_is_named_by_every_version_it_depends_on(monkeypatch, tmp_path):
    from overmind._util import distributions
    from overmind.adapters import discovery
    from overmind.loading import adapter_check

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    discovery.states()
    path = adapter_check._memo_path("transformers")
    assert path.startswith(str(tmp_path / "overmind" / "self-checks" / "transformers-"))
    real = distributions.version
    for moved in ("torch", "transformers"):
        monkeypatch.setattr(distributions, "version", lambda n, m=moved: "9.9" if n == m else real(n))
        assert adapter_check._memo_path("transformers") != path, f"another {moved} must check again"
    monkeypatch.setattr(distributions, "version", real)
    assert adapter_check._memo_path("transformers") == path


def _deco(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class _Shapes:
    @classmethod
    def positional(cls, x, /, y, *args, z, **kwargs): ...

    @classmethod
    def bare(cls): ...

    @classmethod
    def star_first(*args): ...

    @classmethod
    def keyword_first(*, x): ...

    @classmethod
    @_deco
    def wrapped(cls, path, *, dtype=None): ...

    copied = classmethod(_deco(positional.__get__(None, object)))  # a copy wrapping a bound method, as transformers'

    def method(self, p, q=1): ...


def _plain_function(a, *, b): ...


def test_parameters_read_off_the_code_are_inspects():
    from overmind.adapters.self_check import _parameters, _plain_parameters

    shapes = (_Shapes.positional, _Shapes.bare, _Shapes.star_first, _Shapes.keyword_first, _Shapes.wrapped,
              _Shapes.copied, _Shapes().method, _Shapes.method, _plain_function, _deco(_deco(_plain_function)))
    for loader in shapes:
        try:
            expected = _parameters(loader)
        except ValueError:
            expected = None
        assert _plain_parameters(loader) == expected, loader
