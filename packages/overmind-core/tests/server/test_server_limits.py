"""The server under resource limits and idle or half-sent connections: a thread limit
(a pids cgroup) does not end it, idle connections cost no thread, a silent peer is dropped after the hello
timeout, an idle one after the idle timeout (the client reconnects without noticing), and a frame's
announced size is never allocated up front; buffered bytes have a small per-frame and a bounded total."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import accepts
from overmind.ipc.protocol import PROTOCOL_VERSION, recv_message, send_message

PIDS_CGROUP = "/sys/fs/cgroup/pids"


def _proc_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def _hello(runtime_dir: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(runtime_dir, "server.sock"))
    send_message(sock, {"op": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(), "version": "test"})
    reply, _ = recv_message(sock)
    assert reply["ok"], reply
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _can_use_pids_cgroup() -> bool:
    probe = os.path.join(PIDS_CGROUP, f"om-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_use_pids_cgroup(), reason="needs a writable cgroup-v1 pids controller")
def test_server_in_a_pids_cgroup_serves_many_connections_and_keeps_its_entries(overmind_runtime, sealed_memfd):
    group = os.path.join(PIDS_CGROUP, f"om-test-{os.getpid()}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "pids.max"), "w") as f:
            f.write("3")  # the server and two more threads, at most

        def enter_group() -> None:
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        server = subprocess.Popen([sys.executable, "-m", "overmind.server", "--runtime-dir", overmind_runtime],
                                  preexec_fn=enter_group, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            sock = os.path.join(overmind_runtime, "server.sock")
            deadline = time.monotonic() + 10
            while not accepts(sock) and time.monotonic() < deadline:
                time.sleep(0.02)
            owner = Client(autostart=False)
            entry_id = owner.publish("k", sealed_memfd(b"kept"))
            clients = [Client(autostart=False) for _ in range(24)]
            for c in clients:
                assert c.status()["pid"] == server.pid
            assert server.poll() is None, "the server died under the thread limit"
            assert owner.get("k", claim=False).entry["entry_id"] == entry_id
            assert owner.status()["clients"] == 25
            for c in clients:
                c.close()
            owner.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)
    finally:
        os.rmdir(group)


def test_idle_connections_cost_no_thread(overmind_runtime):
    pid = Client().status()["pid"]
    socks = [_hello(overmind_runtime) for _ in range(200)]
    try:
        assert Client().status()["clients"] >= 200
        assert _proc_field(pid, "Threads") <= 2, "one thread per connection"
    finally:
        for s in socks:
            s.close()


def test_a_peer_that_never_says_hello_is_dropped(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_HELLO_TIMEOUT", "0.5")
    Client().status()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(overmind_runtime, "server.sock"))
    try:
        assert _closed_by_server(sock, within=5)
    finally:
        sock.close()


def test_idle_connection_is_closed_but_one_holding_a_claim_is_not_and_clients_reconnect(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_IDLE_TIMEOUT", "0.5")
    c = Client()
    first_pid = c.status()["pid"]
    idle = _hello(overmind_runtime)
    claimer = _hello(overmind_runtime)
    send_message(claimer, {"op": "get", "key": "held", "claim": True, "wait": False})
    assert recv_message(claimer)[0]["status"] == "claimed"
    try:
        assert _closed_by_server(idle, within=5)
        time.sleep(1.0)
        send_message(claimer, {"op": "status"})
        reply, _ = recv_message(claimer)
        assert reply["ok"] and reply["claims"] == 1, "the connection holding a claim was closed"
        # The client's own persistent connection was closed as idle too: its next request reconnects.
        st = c.status()
        assert st["pid"] == first_pid
        with open(os.path.join(overmind_runtime, "server.log")) as f:
            assert "idle" in f.read()
    finally:
        idle.close()
        claimer.close()


def test_announced_frames_are_not_allocated_and_stalled_ones_are_dropped(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_FRAME_TIMEOUT", "2")
    pid = Client().status()["pid"]
    before = _proc_field(pid, "VmRSS")
    huge = [_hello(overmind_runtime) for _ in range(8)]  # the 8 x 64 MiB
    stalled = [_hello(overmind_runtime) for _ in range(8)]  # frames a control message may have, never finished
    socks = huge + stalled
    try:
        for s in huge:
            s.sendall(struct.pack(">I", 64 * 1024 * 1024 - 1) + b'{"op": "st')
        for s in stalled:
            s.sendall(struct.pack(">I", 512 * 1024) + b'{"op": "st')
        time.sleep(0.5)
        grown_kib = _proc_field(pid, "VmRSS") - before
        assert grown_kib < 16 * 1024, f"the server grew by {grown_kib} KiB for 16 frames it never received"
        assert all(_closed_by_server(s, within=10) for s in huge)
        t0 = time.monotonic()
        assert all(_closed_by_server(s, within=10) for s in stalled), "stalled frames must time out"
        assert time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()


def test_frames_above_the_request_limit_are_refused(overmind_runtime):
    Client().status()
    sock = _hello(overmind_runtime)
    try:
        sock.sendall(struct.pack(">I", 8 * 1024 * 1024) + b"{")
        assert _closed_by_server(sock, within=5)
        with open(os.path.join(overmind_runtime, "server.log")) as f:
            assert "8388608-byte frame" in f.read()
    finally:
        sock.close()
    assert Client().status()["clients"] == 1


def test_buffered_bytes_are_bounded_in_total(overmind_runtime):
    pid = Client().status()["pid"]
    before = _proc_field(pid, "VmRSS")
    frame = 1024 * 1024 - 64  # under the per-frame limit
    socks = [_hello(overmind_runtime) for _ in range(96)]
    for s in socks:
        s.setblocking(False)
    pending = {s: struct.pack(">I", frame) + b"[" + b" " * (frame - 2) for s in socks}  # one byte short
    try:
        deadline = time.monotonic() + 20
        stalled_since = time.monotonic()
        while pending and time.monotonic() < deadline and time.monotonic() - stalled_since < 1.0:
            for s in list(pending):
                try:
                    n = s.send(pending[s])
                except BlockingIOError:
                    continue
                stalled_since = time.monotonic()
                pending[s] = pending[s][n:]
                if not pending[s]:
                    del pending[s]
        time.sleep(0.3)
        grown_mib = (_proc_field(pid, "VmRSS") - before) / 1024
        assert grown_mib < 48, f"96 half-sent 1 MiB frames cost the server {grown_mib:.0f} MiB"
        # Small requests still go through while the buffer budget is taken.
        assert Client().status()["pid"] == pid
    finally:
        for s in socks:
            s.close()
