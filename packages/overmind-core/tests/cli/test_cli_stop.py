"""``overmind stop`` against a server that does not answer (``kill -STOP``): found by the pid in its lock file,
said so, and stopped (SIGTERM and SIGCONT, so it exits cleanly; ``--force``: SIGKILL); never "no server is
running" while one holds the runtime directory. ``status`` on such a server gives up after the control timeout
and names the setting that bounds it. Real servers, real signals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import server_lock_free
from overmind.client.stopping import process_state

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")


def om(*args: str, rc: int | None = 0) -> subprocess.CompletedProcess:
    out = subprocess.run([OVERMIND, *args], capture_output=True, text=True, timeout=120)
    if rc is not None:
        assert out.returncode == rc, (out.returncode, out.stdout, out.stderr)
    return out


@pytest.fixture
def stopped_server(overmind_runtime):
    """A running server, then stopped with SIGSTOP (resumed and killed afterwards whatever the test did)."""
    client = Client()
    pid = client.status()["pid"]
    client.close()
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while process_state(pid) != "T":  # the signal is delivered asynchronously
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.01)
    yield pid
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def test_stop_finds_a_stopped_server_says_so_and_stops_it_cleanly(stopped_server, overmind_runtime):
    assert process_state(stopped_server) == "T"
    out = om("stop")
    assert f"the server (pid {stopped_server}, stopped) did not answer" in out.stderr
    assert f"stopped server pid {stopped_server} (SIGTERM)" in out.stdout
    assert "no server is running" not in out.stdout
    assert _gone(stopped_server) and server_lock_free(overmind_runtime)
    log = open(os.path.join(overmind_runtime, "server.log")).read()
    assert f"server pid {stopped_server} stopped" in log  # its own orderly end: SIGTERM ran its handler
    assert om("stop").stdout.strip() == "no server is running"


def test_stop_force_kills_a_server_that_does_not_answer(stopped_server, overmind_runtime):
    out = json.loads(om("stop", "--force", "--json").stdout)
    assert out["stopped"] is True and out["pid"] == stopped_server and out["how"] == "killed"
    assert "did not answer" in out["note"]
    assert _gone(stopped_server) and server_lock_free(overmind_runtime)


def test_status_of_a_stopped_server_names_the_control_timeout(stopped_server, overmind_runtime):
    out = om("status", rc=None)
    assert out.returncode != 0
    assert f"the server (pid {stopped_server}) did not answer" in out.stderr
    assert "within 2 s" in out.stderr and "OVERMIND_CONTROL_TIMEOUT" in out.stderr
