"""The compiled extension serves only the torch it was built for; ``overmind build-native`` builds one for the
installed torch, and new processes use it (``overmind.native.extension``).

A newer torch cannot be installed for a test: one fresh process is told it runs torch 2.99.0 (``torch.__version__``,
before Overmind is imported), which is what the selection reads; the build is real (torch's extension builder,
the sources shipped in the package) into a private ``XDG_CACHE_HOME``.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from overmind.testing import run_fresh

pytest.importorskip("torch")

DESCRIBE = '''
import sys
import torch
if "{release}":
    torch.__version__ = "{release}"
if {block_installed}:
    sys.modules["overmind.native._C"] = None  # as if overmind-core were installed without it
from overmind.native import zerocopy
from overmind.testing import report
data = bytearray(range(16))
storage = zerocopy.storage_from_buffer(memoryview(data))
report(dict(zerocopy.describe(), same=bytes(storage) == bytes(data),
            aliased=storage.data_ptr() == __import__("ctypes").addressof((__import__("ctypes").c_char * 16).from_buffer(data))))
'''


def _describe(tmp_path, release: str = "", block_installed: bool = False) -> dict:
    return run_fresh(DESCRIBE.format(release=release, block_installed=block_installed),
                     env={"XDG_CACHE_HOME": str(tmp_path)})


def test_an_extension_built_for_another_torch_is_not_used_and_doctor_says_what_to_run(tmp_path, extension_problem):
    if extension_problem:
        pytest.skip(f"overmind.native._C does not import here ({extension_problem})")
    import torch

    here = torch.__version__.split("+")[0]
    info = _describe(tmp_path, release="2.99.0")
    assert info["active"] == "python" and info["same"]
    assert f"overmind.native._C was built for torch {here}, this is torch 2.99.0" in info["reason"]
    assert "run 'overmind build-native' to compile it for this torch" in info["reason"]
    info = _describe(tmp_path)
    assert info["active"] == "c" and info["reason"] == f"installed with overmind-core, built for torch {here}"


@pytest.mark.long(150)
def test_build_native_compiles_for_the_installed_torch_and_new_processes_use_it(tmp_path, extension_problem):
    if extension_problem:
        pytest.skip(f"overmind.native._C does not import here ({extension_problem})")
    import torch

    here = torch.__version__.split("+")[0]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "overmind", "build-native"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nothing to build: installed with overmind-core" in done.stdout
    assert _describe(tmp_path, block_installed=True)["active"] == "python"
    built = subprocess.run(command + ["--force"], env=env, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    folder = tmp_path / "overmind" / "native" / f"torch-{here}-{sys.implementation.cache_tag}"
    [so] = [p for p in folder.iterdir() if p.name.startswith("_C")]
    assert f"overmind: built {so}" in built.stdout
    info = _describe(tmp_path, block_installed=True)
    assert info["active"] == "c", info
    assert info["reason"] == f"built for torch {here} by overmind build-native ({so})"
    assert info["extension_path"] == str(so) and info["same"] and info["aliased"]
