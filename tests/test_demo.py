"""The README's main job runs: scripts/demo.py's one table (a large model plain against a warm hit, a script under
``overmind run``, a model loaded once against Overmind's first load, the real MiniLM plain against a warm hit),
built from fresh processes at the small scale, with the same weights in every process, the warm process's weights
in Overmind's shared memory, and set-up lines from ``overmind doctor`` that name only what the demo uses. It runs
as a user runs it: without the test-only adapters, which only the test processes see
(``_support.TEST_PLUGINS_DIR``)."""
from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys

import pytest

from _support import without_test_plugins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo():
    spec = importlib.util.spec_from_file_location("overmind_demo", os.path.join(ROOT, "scripts", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_pairs_each_use_plain_against_overmind():
    def samples(*loads: float, ready: float = 6.0) -> list[dict]:
        return [{"load_s": x, "ready_s": ready, "checksum": 1.5, "where": "?"} for x in loads]

    results = {"pipeline": {"plain": samples(2.6, 2.4, 2.8), "first": samples(2.7, 2.5, 2.6),
                            "cold": samples(3.1), "warm": samples(0.1, 0.12, 0.08),
                            "run": samples(0.1, 0.1, 0.1, ready=0.2)},
               "minilm": {"plain": samples(0.4, 0.4, 0.4), "first": samples(0.4), "cold": samples(0.6),
                          "warm": samples(0.08, 0.08, 0.08)}}
    lines = _demo().table(results, 3, params=1_066_000_000)
    text = "\n".join(lines)
    rows = {line[:3]: line for line in lines if line.startswith("(")}
    assert list(rows) == ["(a)", "(b)", "(c)", "(d)"]
    assert rows["(a)"].endswith("26.00x") and rows["(b)"].endswith("30.00x"), text
    assert rows["(c)"].endswith("0.96x") and "first load" in rows["(c)"], text  # 2.6/2.7, 2.4/2.5, 2.8/2.6
    assert rows["(d)"].endswith("5.00x") and "1.07 B parameters" in text, text
    assert "second load, which publishes it: 3.10 s (1.19x plain's median)" in text, text


@pytest.mark.long(70)  # seconds on a CI machine: conftest.py runs it early
def test_demo_shows_what_overmind_is_for_in_fresh_processes(tmp_path):
    before = set(glob.glob("/tmp/om-demo-*"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo.py")], capture_output=True,
                         text=True, timeout=900,
                         env={**without_test_plugins(), "DEMO_RUNS": "1", "DEMO_SCALE": "small",
                              "DEMO_FIXTURES": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(glob.glob("/tmp/om-demo-*")) <= before, "the demo left its runtime directory behind"
    lines = out.stdout.splitlines()
    rows = [line for line in lines if line[:4] in ("(a) ", "(b) ", "(c) ", "(d) ")]
    assert len(rows) == 4 and all(row.rstrip().endswith("x") for row in rows), out.stdout
    where = next(line for line in lines if line.startswith("the pipeline's weights:"))
    plain, warm = where.split("; a warm hit")
    assert "Overmind's shared memory" in warm and "Overmind" not in plain, where
    assert "pipeline: the same weights in all 5 processes: True" in out.stdout, out.stdout
    assert "all-MiniLM-L6-v2: the same weights in all 4 processes: True" in out.stdout, out.stdout
    doctor = [line for line in lines if line.startswith("[")]
    assert any("adapter transformers" in line for line in doctor) and any("adapter diffusers" in line for line in doctor)
    assert all(line.startswith("[ok]") for line in doctor), doctor
    assert not any(name in out.stdout for name in ("timm", "fixture_broken", "adapter fixture")), doctor
