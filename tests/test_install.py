"""The install tells the truth: the README's install lines, run in a fresh venv, give a working
Overmind with its compiled extension and the libraries of the chosen extras; one version; an SPDX license;
the README's supported versions are the packages' own.

The wheelhouse line runs with ``BUILD_PYTHON`` set to this venv's interpreter: the wheels are built there, reusing
its objects of ``overmind.native._C``, instead of in a build venv of the script's own (the default, which a user gets)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

import overmind
from _support.adapter_packages import adapter_names, adapter_pyprojects

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = [ROOT / "pyproject.toml", *sorted(ROOT.glob("packages/*/pyproject.toml"))]


def _toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _readme_install_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- install:begin", 1)[1].split("<!-- install:end -->", 1)[0]
    code = block.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in code.strip().splitlines() if line.strip()]


def test_one_version_everywhere():
    version = overmind.__version__
    for path in PYPROJECTS:
        project = _toml(path)["project"]
        if path.parent.name == "overmind-core":
            assert project["dynamic"] == ["version"], "overmind-core reads its version from overmind.__version__"
        else:
            assert project["version"] == version, path
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        for req in requirements:
            if req.startswith("overmind-"):
                assert req.endswith(f"=={version}"), (path, req)


def test_license_file_and_spdx_strings():
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    for path in PYPROJECTS:
        project = _toml(path)["project"]
        assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"], path
        assert (path.parent / "LICENSE").read_text() == (ROOT / "LICENSE").read_text(), path


def _installed(name: str):
    """The distribution ``name`` as the venv installed it (its site-packages metadata), not an ``.egg-info`` folder
    of the checkout that a wheel build in progress rewrites (the working directory is on ``sys.path``)."""
    import site
    from importlib import metadata

    return next(metadata.distributions(name=name, path=site.getsitepackages()))


def _extras() -> dict[str, list[str]]:
    """The metapackage's extras as installed (its metadata: setup.py finds one per adapter of packages/)."""
    extras: dict[str, list[str]] = {}
    for line in _installed("overmind").requires or []:
        req, _, marker = line.partition(";")
        found = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", marker)
        if found:
            extras.setdefault(found.group(1), []).append(req.replace(" ", ""))
    return extras


def test_extras_install_their_libraries_and_the_readme_names_their_ranges():
    extras = _extras()
    assert set(extras) == adapter_names() | {"all"}, sorted(extras)
    readme = re.sub(r"\s+", "", (ROOT / "README.md").read_text())
    for name, pyproject in adapter_pyprojects().items():
        spelled = pyproject.get("tool", {}).get("overmind", {}).get("extra", [f"overmind-{name}[instruments]"])
        assert sorted(extras[name]) == sorted(f"{r}=={overmind.__version__}" for r in spelled), extras[name]
        own = [r for r in spelled if r.startswith(f"overmind-{name}[")]
        if not own:
            continue  # the adapter alone (stable-fast has no wheel on the index)
        assert "instruments" in own[0].split("[")[1].rstrip("]").split(","), own
        assert f"{own[0]}=={overmind.__version__}" in extras[name], extras[name]
        for req in pyproject["project"]["optional-dependencies"]["instruments"]:
            assert re.sub(r"\s+", "", req) in readme, f"README does not say {req}"


def test_the_diffusers_extra_installs_accelerate():
    """diffusers loads with low_cpu_mem_usage only with accelerate; it does not require it, so the extra does."""
    extras = _extras()
    assert any(r.startswith("overmind-diffusers[") and "companions" in r for r in extras["diffusers"])
    companions = [line.split(";")[0].replace(" ", "") for line in _installed("overmind-diffusers").requires or []
                  if re.search(r"extra\s*==\s*['\"]companions['\"]", line)]
    assert companions == ["accelerate>=1.15"], companions


@pytest.mark.long(370)  # seconds on a CI machine: conftest.py runs it early
@pytest.mark.timeout(1800)
def test_a_fresh_venv_installed_as_the_readme_says_serves_a_cached_load(tmp_path, overmind_runtime):
    lines = _readme_install_lines()
    assert lines[0].startswith("./scripts/wheelhouse ") and lines[1].startswith("pip install --no-index"), lines
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    # The wheelhouse goes outside the checkout (tests leave nothing there): the README's dist/, kept between runs
    # in the user's cache so that its downloads are made once.
    dist = os.environ.get("OVERMIND_TEST_WHEELHOUSE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "overmind", "test-wheelhouse")
    had_dist = (ROOT / "dist").exists()
    for line in lines:
        argv = shlex.split(line)
        line_env = env
        if argv[0] == "pip":
            argv = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *argv[1:]]
            argv = [dist if a == "dist" and argv[i - 1] == "--find-links" else a for i, a in enumerate(argv)]
            assert dist in argv, f"the README's pip line installs from dist/: {line}"
        else:  # the wheels are built with this venv (torch pinned as scripts/wheelhouse pins it), reusing the
            # objects of its overmind.native._C (~150 s of CPU less than a build venv of its own: the suite's longest test)
            line_env = {**env, "BUILD_PYTHON": sys.executable, "DIST": dist}
        out = subprocess.run(argv, cwd=ROOT, env=line_env, capture_output=True, text=True, timeout=1500)
        assert out.returncode == 0, (line, out.stdout[-3000:], out.stderr[-5000:])

    assert had_dist or not (ROOT / "dist").exists(), "the test left a dist/ folder in the checkout"

    model_dir = tmp_path / "tiny-bert"
    load = textwrap.dedent(f"""
        import json, os, sys
        import torch, overmind
        from overmind.native import zerocopy
        from overmind.shm import mappings
        def overmind_mapped(address):  # as overmind.testing does (it needs pytest, which this venv lacks): a
            if mappings.contains(address):  # checkpoint file Overmind mapped for a hit (a file entry), or a memfd
                return True
            for line in open("/proc/self/maps"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    return "/memfd:overmind" in line
            return False
        overmind.activate()
        from transformers import AutoModel, BertConfig, BertModel
        path = {str(model_dir)!r}
        if not os.path.isdir(path):
            torch.manual_seed(0)
            BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64)).save_pretrained(path)
        model = AutoModel.from_pretrained(path)
        p = next(model.parameters())
        print(json.dumps({{"mapped": overmind_mapped(p.data_ptr()), "impl": zerocopy.describe()["active"],
                          "sum": float(p.sum()), "file": overmind.__file__}}))
    """)
    python = str(venv / "bin" / "python")
    runs = []
    for _ in range(2):
        out = subprocess.run([python, "-c", load], env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                             text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-5000:]
        runs.append(__import__("json").loads(out.stdout.strip().splitlines()[-1]))
    assert all(r["file"].startswith(str(venv)) for r in runs), runs  # the venv's overmind, not the checkout's
    assert all(r["impl"] == "c" for r in runs), runs  # overmind.native._C came with the wheel
    assert runs[1]["mapped"] and runs[0]["sum"] == runs[1]["sum"], runs
    adapters = subprocess.run([python, "-m", "overmind", "doctor", "--brief"], env=env, capture_output=True,
                              text=True, timeout=300).stdout
    assert "adapter transformers" in adapters and "fixture" not in adapters, adapters  # no test-only adapters
