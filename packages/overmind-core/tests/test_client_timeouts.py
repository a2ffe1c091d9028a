"""Finding 3 of issue 10: every client wait is bounded. A stopped server (``kill -STOP``: Ctrl-Z on
``overmind serve``, a debugger) costs a load at most the reply timeout, with one warning and the plain
result, whether the process already had a connection or opens a new one; after SIGCONT loads hit again.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import warnings

import torch

import overmind
from overmind.fallback import OvermindWarning
from overmind.testing import overmind_mapped, server_pids

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fault_procs, fault_loaders
import fault_loaders as L  # noqa: E402
import fault_procs  # noqa: E402

FRESH_LOAD = """
import time, warnings, torch, overmind
import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report, overmind_mapped
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = overmind.load(L.build, 5)
report({"took": time.monotonic() - t0, "right": bool(torch.equal(obj, L.expected(5))),
        "mapped": overmind_mapped(obj.data_ptr()),
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""


def _load(n):
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = overmind.load(L.build, n)
    warned = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    return obj, warned, time.monotonic() - t0


def test_a_stopped_server_costs_a_load_one_bounded_timeout(runtime_dir, monkeypatch):
    monkeypatch.setenv("OVERMIND_REPLY_TIMEOUT", "1")
    first, warned, _ = _load(5)  # publishes; this process now holds a connection
    assert not warned and overmind_mapped(first.data_ptr())
    (pid,) = server_pids(runtime_dir)
    os.kill(pid, signal.SIGSTOP)
    try:
        obj, warned, took = _load(5)  # on the connection this process already has
        assert torch.equal(obj, L.expected(5)) and not overmind_mapped(obj.data_ptr())
        assert len(warned) == 1 and "did not answer" in warned[0], warned
        assert took < 4, took
        fresh = fault_procs.run(FRESH_LOAD, {"OVERMIND_REPLY_TIMEOUT": "1"}, timeout=60)  # a new connection
        assert fresh.get("right") and not fresh["mapped"], fresh
        assert len(fresh["warned"]) == 1 and "did not answer" in fresh["warned"][0], fresh
        assert fresh["took"] < 4, fresh
    finally:
        os.kill(pid, signal.SIGCONT)
    again, warned, _ = _load(5)
    assert not warned and overmind_mapped(again.data_ptr()) and torch.equal(again, L.expected(5))
    fresh = fault_procs.run(FRESH_LOAD, timeout=60)
    assert fresh["right"] and fresh["mapped"] and fresh["warned"] == [], fresh
    assert server_pids(runtime_dir) == [pid]
