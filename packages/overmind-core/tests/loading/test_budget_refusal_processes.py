"""An entry larger than the whole budget is refused before it is pickled or written, in the process that loads it
first, and every later process loads it plainly, at plain speed, with one warning each: fresh processes against
one server with a 1 MiB budget (``OVERMIND_MAX_BYTES``), compared with the plain call."""
from __future__ import annotations

import subprocess
import sys

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh

pytest.importorskip("torch")

SCRIPT = '''
import os, warnings
import torch
import overmind
from _support.fault_loaders import reduce_counted_tensor
from overmind.testing import report

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn = reduce_counted_tensor
    obj = overmind.load(fn, 4 << 20) if os.environ.get("OVERMIND_ON") else fn(4 << 20)
status = overmind.cache_info().status if os.environ.get("OVERMIND_ON") else {}
report({"sum": float(obj.tensor.sum()), "n": obj.tensor.numel(),
        "warnings": [f"{type(w.message).__name__}: {w.message}" for w in caught],
        "publishes": status.get("publishes"), "refused_keys": status.get("refused_keys"),
        "entries": status.get("entries")})
'''


def test_an_entry_larger_than_the_budget_is_refused_once_and_loaded_plainly_after(overmind_runtime, tmp_path):
    log = tmp_path / "pickled.log"
    env = {"PICKLED_LOG": str(log), "OVERMIND_MAX_BYTES": "1M", "PYTHONPATH": pythonpath_env()}
    plain = run_fresh(SCRIPT, env=env)
    assert plain["warnings"] == [] and not log.exists()
    first = run_fresh(SCRIPT, env={**env, "OVERMIND_ON": "1"})
    second = run_fresh(SCRIPT, env={**env, "OVERMIND_ON": "1"})
    for run in (first, second):
        assert (run["sum"], run["n"]) == (plain["sum"], plain["n"])
        assert (run["publishes"], run["entries"], run["refused_keys"]) == (0, 0, 1)
        [warning] = run["warnings"]
        assert warning.startswith("OvermindWarning: overmind: ")
        assert "its entry needs 4.0 MiB and the whole budget is 1.0 MiB: the server remembers this key" in warning
        assert "set OVERMIND_MAX_BYTES above 4.0 MiB and restart the server ('overmind stop')" in warning
    assert first["warnings"][0].endswith("; returned the plain result.") and "; loaded plainly." in second["warnings"][0]
    assert not log.exists(), "the result was never pickled: refused before the work, in both processes"
    shown = subprocess.run([sys.executable, "-m", "overmind", "status"], capture_output=True, text=True, timeout=60,
                           env={**__import__("os").environ, "OVERMIND_RUNTIME_DIR": overmind_runtime}).stdout
    assert "refused  1 key larger than the budget, loaded plainly (OVERMIND_MAX_BYTES)\n" in shown, shown
    subprocess.run([sys.executable, "-m", "overmind", "stop"], env={**__import__("os").environ,
                                                                    "OVERMIND_RUNTIME_DIR": overmind_runtime},
                   capture_output=True, timeout=60)
    bigger = run_fresh(SCRIPT, env={**env, "OVERMIND_ON": "1", "OVERMIND_MAX_BYTES": "64M"})
    assert bigger["warnings"] == [] and bigger["publishes"] == 1, "under another budget it is cached"
    assert log.exists()
