"""Every client wait is bounded. A stopped server (``kill -STOP``: Ctrl-Z on
``overmind serve``, a debugger) costs a load at most the reply timeout, with one warning and the plain
result, whether the process already had a connection or opens a new one; after SIGCONT loads hit again.
"""
from __future__ import annotations

import os
import signal
import time
import warnings

import pytest
import torch

import overmind
from _support import fault_loaders as L
from _support import fault_procs
from overmind.fallback import OvermindWarning
from overmind.testing import overmind_mapped, server_pids

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

FRESH_LOAD = """
import time, warnings, torch, overmind
from _support import fault_loaders as L
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


def test_a_stopped_server_costs_a_load_one_bounded_timeout(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_REPLY_TIMEOUT", "1")
    first, warned, _ = _load(5)  # publishes; this process now holds a connection
    assert not warned and overmind_mapped(first.data_ptr())
    (pid,) = server_pids(overmind_runtime)
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
    assert server_pids(overmind_runtime) == [pid]


HOLDER = """
import overmind
from _support import fault_loaders as L
try:
    overmind.load(L.gated, 6, "s6")
except Exception:
    pass
"""

WAITER = """
import time, warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report
L.touch("waiter-start")
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = overmind.load(L.gated, 6, "s6")  # waits on the holder's claim; the server stops meanwhile
report({"took": time.monotonic() - t0, "right": bool(torch.equal(obj, L.expected(6))),
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""


def test_a_server_stopped_while_a_load_waits_costs_the_wait_timeout_plus_one_reply(overmind_runtime, tmp_path):
    env = {"GATE_DIR": str(tmp_path), "OVERMIND_REPLY_TIMEOUT": "1", "OVERMIND_WAIT_TIMEOUT": "2"}
    holder = fault_procs.start(HOLDER, env)
    pid = None
    try:
        assert fault_procs.wait_file(str(tmp_path / "claimed-s6")), fault_procs.finish(holder, 1)
        own_gates = tmp_path / "waiter"  # the waiter's gate is open: its plain load, when it falls back, is quick
        own_gates.mkdir()
        (own_gates / "open-s6").touch()
        waiter = fault_procs.start(WAITER, {**env, "GATE_DIR": str(own_gates)})
        assert fault_procs.wait_file(str(own_gates / "waiter-start"))
        time.sleep(0.5)  # the waiter is now parked on the claim
        (pid,) = server_pids(overmind_runtime)
        os.kill(pid, signal.SIGSTOP)
        seen = fault_procs.finish(waiter, timeout=30)
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        holder.kill()
        fault_procs.finish(holder, 5)
    assert seen.get("right"), seen
    assert len(seen["warned"]) == 1 and "did not answer" in seen["warned"][0], seen
    assert seen["took"] < 2 + 1 + 1.5, seen
