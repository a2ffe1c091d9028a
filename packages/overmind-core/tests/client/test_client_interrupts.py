"""A load interrupted while it waits on another process's claim (Ctrl-C, or a
TimeoutError raised by the user's own SIGALRM handler) propagates the user's exception unchanged, leaves
no late reply behind for the next loads to read, and leaves no claim behind for other processes to wait on.

Three real processes per test: a holder (claims the key and waits on a gate), the victim (interrupted while
waiting on that claim) and, for the claim test, a third loader.
"""
from __future__ import annotations

import pytest

from _support import fault_procs

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

HOLDER = """
import os, torch, overmind
from _support import fault_loaders as L
from overmind.testing import report
try:
    overmind.load(L.gated, int(os.environ["N"]), os.environ["TAG"])
    outcome = "published"
except RuntimeError as e:
    outcome = "failed"
L.touch("holder-done")
report({"outcome": outcome})
"""

# The victim arms the interrupt, loads the held key, then (after opening the gate and seeing the holder
# finish) runs more loads and reports what each returned.
VICTIM = """
import os, signal, threading, time, warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report
kind, tag, n = os.environ["KIND"], os.environ["TAG"], int(os.environ["N"])
raised = []
if kind == "alarm":
    def on_alarm(signum, frame):
        exc = TimeoutError("the user's own deadline")
        raised.append(exc)
        raise exc
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.8)
else:
    # A process started in the background by a non-interactive shell (as CI may start the suite) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: install it, as a terminal would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    overmind.load(L.gated, n, tag)
    outcome, same = "returned", False
except BaseException as e:
    outcome, same = type(e).__name__, bool(raised) and e is raised[0]
waited = time.monotonic() - t0
L.touch(f"open-{tag}")
L.wait_for("holder-done")
checks = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for fn, args in [(L.build, (2,)), (L.gated, (n, tag)), (L.build, (1,)), (L.build, (3,)), (L.build, (2,))]:
        try:
            obj = overmind.load(fn, *args)
            checks.append(bool(torch.equal(obj, L.expected(args[0]))))
        except BaseException as e:
            checks.append(f"{type(e).__name__}: {e}")
warned = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
if os.environ.get("STAY"):
    L.touch("victim-ready")
    L.wait_for("victim-may-exit", 30)
report({"outcome": outcome, "same": same, "waited": waited, "checks": checks, "warned": warned})
"""

THIRD = """
import time, warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = overmind.load(L.gated, 3, "t3")
report({"right": bool(torch.equal(obj, L.expected(3))), "took": time.monotonic() - t0,
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""

EXPECTED_EXC = {"alarm": "TimeoutError", "sigint": "KeyboardInterrupt"}


def _env(gates, **kw):
    return {"GATE_DIR": str(gates), "OVERMIND_WAIT_TIMEOUT": "20", **kw}


@pytest.mark.parametrize("kind", ["alarm", "sigint"])
def test_interrupted_wait_then_next_loads_return_the_right_objects(overmind_runtime, tmp_path, kind):
    holder = fault_procs.start(HOLDER, _env(tmp_path, N="1", TAG="k1"))
    try:
        assert fault_procs.wait_file(str(tmp_path / "claimed-k1")), fault_procs.finish(holder, 1)
        victim = fault_procs.run(VICTIM, _env(tmp_path, N="1", TAG="k1", KIND=kind), timeout=60)
    finally:
        held = fault_procs.finish(holder)
    assert held == {"outcome": "published"}
    assert victim.get("outcome") == EXPECTED_EXC[kind], victim
    if kind == "alarm":
        assert victim["same"], "the handler's own exception object must reach the user"
    assert victim["waited"] < 5, victim
    assert victim["checks"] == [True] * 5, victim
    assert victim["warned"] == [], victim


@pytest.mark.parametrize("kind", ["alarm", "sigint"])
def test_interrupted_waiter_leaves_no_claim_for_others_to_wait_on(overmind_runtime, tmp_path, kind):
    holder = fault_procs.start(HOLDER, _env(tmp_path, N="3", TAG="t3", GATED_FAIL="1"))
    victim = None
    try:
        assert fault_procs.wait_file(str(tmp_path / "claimed-t3")), fault_procs.finish(holder, 1)
        # The victim stays alive after its interrupted load, idle, as a notebook kernel would.
        victim = fault_procs.start(VICTIM, _env(tmp_path, N="3", TAG="t3", KIND=kind, STAY="1"))
        assert fault_procs.wait_file(str(tmp_path / "victim-ready"), 40), fault_procs.finish(victim, 1)
        assert fault_procs.finish(holder) == {"outcome": "failed"}  # its claim was released
        third = fault_procs.run(THIRD, _env(tmp_path, OVERMIND_WAIT_TIMEOUT="4"), timeout=60)
    finally:
        (tmp_path / "open-t3").touch()
        (tmp_path / "victim-may-exit").touch()
        seen = fault_procs.finish(victim) if victim else None
        if holder.poll() is None:
            holder.kill()
    assert third["warned"] == [] and third["right"], third
    assert seen["outcome"] == EXPECTED_EXC[kind], seen
