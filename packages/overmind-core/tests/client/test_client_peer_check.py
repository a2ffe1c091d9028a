"""The client trusts only a server of its own uid. An attacker (uid nobody) who can
write the directory holding the victim's runtime directory swaps in its own directory and server at the worst
moment: after the victim's checks of the directory and the socket file passed, before its ``connect()``. The
victim reaches the attacker's socket every time, and the attacker's server never hears a byte from it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from _support import fault_procs
from overmind.client.launcher import ensure_server
from overmind.ipc.protocol import PROTOCOL_VERSION
from overmind.testing import server_pids, stop_servers

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot read the interpreter under /root
ATTEMPTS = 25

# Each attempt asks the attacker to swap its directory in once the real check of the socket file passed
# (the race won), then swaps the victim's back and checks that the real server still answers.
VICTIM = """
import collections, os
from overmind.ipc import peer
from overmind.client.connection import Client
from overmind.ipc.peer import UntrustedServer
from overmind.testing import report
rt = os.environ["OVERMIND_RUNTIME_DIR"]
real_pid = int(os.environ["REAL_PID"])
ctl, ack = int(os.environ["CTL_FD"]), int(os.environ["ACK_FD"])
state = {"armed": False, "swapped": False}
checked = peer.check_socket_file

def swap():
    os.write(ctl, b"s")
    assert os.read(ack, 1) == b"k"
    state["swapped"] = not state["swapped"]

def checked_then_swapped(path):
    checked(path)
    if state["armed"]:
        state["armed"] = False
        swap()

peer.check_socket_file = checked_then_swapped
outcomes = collections.Counter()
for _ in range(int(os.environ["ATTEMPTS"])):
    c = Client(rt, autostart=False)
    state["armed"] = True
    try:
        outcomes["spoken to pid %d" % c.status()["pid"]] += 1
    except UntrustedServer as e:
        outcomes["refused: runs as nobody" if "runs as uid %d," % 65534 in str(e) else "refused: " + str(e)] += 1
    except Exception as e:
        outcomes["%s: %s" % (type(e).__name__, e)] += 1
    finally:
        c.close()
        if state["swapped"]:
            swap()
    c = Client(rt, autostart=False)
    outcomes["then the real server" if c.status()["pid"] == real_pid else "then another pid"] += 1
    c.close()
os.write(ctl, b"q")
report({"outcomes": dict(outcomes)})
"""


def _setpriv() -> list[str] | None:
    tool = shutil.which("setpriv")
    if tool:
        return [tool, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    tool = shutil.which("runuser")
    return [tool, "-u", "nobody", "--"] if tool else None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another user")
def test_a_server_of_another_user_swapped_in_before_connect_is_never_spoken_to(monkeypatch):
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
    ctl_r, ctl_w = os.pipe()
    ack_r, ack_w = os.pipe()
    ends = [ctl_r, ctl_w, ack_r, ack_w]
    attacker = None
    try:
        os.mkdir(rt, 0o700)
        ensure_server(rt)
        (real_pid,) = server_pids(rt)
        attacker = subprocess.Popen([*drop, SYSTEM_PYTHON, script, parent, "rt", str(ctl_r), str(ack_w),
                                     str(PROTOCOL_VERSION)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    pass_fds=(ctl_r, ack_w))
        victim = fault_procs.start(VICTIM, {"ATTEMPTS": str(ATTEMPTS), "REAL_PID": str(real_pid),
                                            "CTL_FD": str(ctl_w), "ACK_FD": str(ack_r)},
                                   pass_fds=(ctl_w, ack_r))
        while ends:  # each end now lives in its process only: either one's death ends the other's wait
            os.close(ends.pop())
        seen = fault_procs.finish(victim, timeout=120)
        _, err = attacker.communicate(timeout=30)
        assert attacker.returncode == 0, err
        with open(os.path.join(parent, "attacker.json")) as f:
            attack = json.load(f)
    finally:
        for fd in ends:
            os.close(fd)
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
        stop_servers(rt)
        shutil.rmtree(parent, ignore_errors=True)
    assert seen.get("outcomes") == {"refused: runs as nobody": ATTEMPTS, "then the real server": ATTEMPTS}, seen
    assert attack == {"connections": ATTEMPTS, "spoke": 0, "swaps": 2 * ATTEMPTS}, attack


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
