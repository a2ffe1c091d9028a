"""Finding 2 of issue 10: the client trusts only a server of its own uid. An attacker (uid nobody) who can
write the directory holding the victim's runtime directory swaps in its own directory and server in a
loop; the victim connects thousands of times; the attacker's server never hears a byte from it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from _support import fault_procs
from overmind.launcher import ensure_server
from overmind.testing import server_pids, stop_servers

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
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile_server.py"), script)
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


LOAD = """
import warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report, overmind_mapped
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = overmind.load(L.build, 9)
report({"right": bool(torch.equal(obj, L.expected(9))), "mapped": overmind_mapped(obj.data_ptr()),
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""


def _listen_as_nobody(sock_path: str) -> tuple[int, int]:
    """Fork a child that, as nobody, listens at ``sock_path`` and writes one byte to the returned pipe for
    every connection on which it receives anything; returns ``(pid, read end)``."""
    ready_r, ready_w = os.pipe()
    heard_r, heard_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only modules this process already imported
        try:
            import socket

            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(sock_path)
            listener.listen(16)
            os.write(ready_w, b"r")
            while True:
                conn, _ = listener.accept()
                conn.settimeout(2)
                try:
                    if conn.recv(1):
                        os.write(heard_w, b"1")
                except OSError:
                    pass
                conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(heard_w)
    assert os.read(ready_r, 1) == b"r"
    os.close(ready_r)
    return pid, heard_r


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the impostor as another user")
@pytest.mark.parametrize("socket_owner", ["theirs", "chowned to us"])
def test_a_load_refuses_a_server_of_another_user_with_one_warning(overmind_runtime, socket_owner):
    sock_path = os.path.join(overmind_runtime, "server.sock")
    os.chmod(overmind_runtime, 0o777)  # only while the impostor binds: then the directory looks right again
    try:
        pid, heard = _listen_as_nobody(sock_path)
    finally:
        os.chmod(overmind_runtime, 0o700)
    try:
        if socket_owner == "chowned to us":
            os.chown(sock_path, os.getuid(), os.getgid())  # the file check passes: only SO_PEERCRED can tell
        seen = fault_procs.run(LOAD, timeout=60)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    os.set_blocking(heard, False)
    try:
        spoke = os.read(heard, 100)
    except BlockingIOError:
        spoke = b""
    os.close(heard)
    assert spoke == b"", "the client sent bytes to another user's server"
    assert seen.get("right") and not seen["mapped"], seen
    assert len(seen["warned"]) == 1, seen
    why = "not a socket of yours" if socket_owner == "theirs" else f"runs as uid {NOBODY}, not as you"
    assert why in seen["warned"][0], seen["warned"]
