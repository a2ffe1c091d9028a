"""The README's main job runs: a plain, a cold and a warm load of the real MiniLM in fresh processes,
identical embeddings, and the warm process's weights mapped by Overmind (a memfd, or the checkpoint as a file entry). It runs as a user runs it:
without the test-only adapters, which only the test processes see (``_support.TEST_PLUGINS_DIR``)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from _support import without_test_plugins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.long(77)  # seconds on a CI machine: conftest.py runs it early
def test_demo_shows_cold_and_warm_loads_across_processes():
    before = set(glob.glob("/tmp/om-demo-*"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo.py")], capture_output=True,
                         text=True, timeout=600, env={**without_test_plugins(), "DEMO_RUNS": "2"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(glob.glob("/tmp/om-demo-*")) <= before, "the demo left its runtime directory behind"
    lines = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()}
    warm = next(line for line in out.stdout.splitlines() if line.startswith("overmind, warm"))
    cold = next(line for line in out.stdout.splitlines() if line.startswith("overmind, cold"))
    for line in (warm, cold):  # an Overmind memfd, or the checkpoint itself as an Overmind file entry
        assert "/memfd:overmind:" in line or "(Overmind file entry)" in line, line
    plain = next(line for line in out.stdout.splitlines() if line.startswith("plain"))
    assert "/memfd:overmind:" not in plain and "(Overmind file entry)" not in plain, plain
    assert "embeddings identical across all " in out.stdout and ": True" in out.stdout, lines
    active = out.stdout.split("active adapters:")[1].splitlines()[0]
    assert "median of" in out.stdout and "transformers" in active
    assert not {"fixture", "fixture_broken", "future"} & set(active.replace(",", " ").split()), active
