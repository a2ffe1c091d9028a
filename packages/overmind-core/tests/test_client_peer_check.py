"""Finding 2 of issue 10: the client trusts only a server of its own uid. An attacker (uid nobody) who can
write the directory holding the victim's runtime directory swaps in its own directory and server in a
loop; the victim connects thousands of times; the attacker's server never hears a byte from it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from overmind.server.launcher import ensure_server
from overmind.testing import server_pids, stop_servers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fault_procs
import fault_procs  # noqa: E402

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot read the interpreter under /root
ATTACK_S = 20.0

VICTIM = """
import collections, os, time
from overmind.client import Client
from overmind.testing import report
rt = os.environ["OVERMIND_RUNTIME_DIR"]
real_pid = int(os.environ["REAL_PID"])
outcomes = collections.Counter()
deadline = time.monotonic() + float(os.environ["VICTIM_S"])
for i in range(int(os.environ["VICTIM_N"])):
    if time.monotonic() > deadline:
        break
    try:
        c = Client(rt, autostart=False)
        pid = c.status()["pid"]
        outcomes["real" if pid == real_pid else "other pid"] += 1
        c.close()
    except Exception as e:
        outcomes[type(e).__name__] += 1
report({"outcomes": dict(outcomes), "attempts": i + 1})
"""


def _setpriv() -> list[str] | None:
    tool = shutil.which("setpriv")
    if tool:
        return [tool, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    tool = shutil.which("runuser")
    return [tool, "-u", "nobody", "--"] if tool else None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another user")
def test_a_swapped_in_server_of_another_user_is_never_spoken_to(monkeypatch):
    drop = _setpriv()
    if drop is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs setpriv or runuser, and a system python3 that nobody can run")
    parent = tempfile.mkdtemp(prefix="om-shared-", dir="/tmp")
    os.chmod(parent, 0o777)  # a shared team directory: everyone may create and rename entries in it
    rt = os.path.join(parent, "rt")
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", rt)
    script = os.path.join(parent, "hostile_server.py")
    shutil.copy(os.path.join(fault_procs.TESTS_DIR, "hostile_server.py"), script)
    os.chmod(script, 0o644)
    attacker = None
    try:
        os.mkdir(rt, 0o700)
        ensure_server(rt)
        (real_pid,) = server_pids(rt)
        victim = fault_procs.start(VICTIM, {"VICTIM_N": "6000", "VICTIM_S": str(ATTACK_S - 4),
                                            "REAL_PID": str(real_pid)})
        attacker = subprocess.Popen([*drop, SYSTEM_PYTHON, script, parent, "rt", str(ATTACK_S)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = fault_procs.finish(victim, timeout=ATTACK_S + 30)
        open(os.path.join(parent, "stop"), "w").close()
        _, err = attacker.communicate(timeout=30)
        assert attacker.returncode == 0, err
        with open(os.path.join(parent, "attacker.json")) as f:
            attack = json.load(f)
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
        stop_servers(rt)
        shutil.rmtree(parent, ignore_errors=True)
    outcomes = seen.get("outcomes")
    assert outcomes is not None, seen
    assert attack["swaps"] > 100, attack
    assert attack["connections"] > 0, (attack, outcomes)  # the race was won: the victim reached its socket
    assert attack["spoke"] == 0, (attack, outcomes)
    assert "other pid" not in outcomes, outcomes
    # Each connection the attacker saw was refused (others were refused before connecting, by the socket
    # file's owner).
    assert outcomes.get("UntrustedServer", 0) >= attack["connections"], (attack, outcomes)
