"""Server process lifecycle and access control: peer uid check, double start, stop, restart, crash."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import accepts, server_lock_free
from overmind.errors import ServerUnavailable
from overmind.ipc.protocol import PROTOCOL_VERSION, recv_message, send_message

NOBODY = 65534


def _as_nobody(sock_path: str) -> dict:
    """In a forked child running as uid/gid nobody: connect to ``sock_path`` and say hello; report how it went.

    A fork rather than a subprocess because nobody cannot read the interpreter under /root; the child only
    uses modules this process already imported.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        result: dict
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            import socket

            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
            except OSError as exc:
                result = {"connect": errno.errorcode.get(exc.errno, str(exc.errno))}
            else:
                try:
                    send_message(s, {"op": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(), "version": "x"})
                    reply, _ = recv_message(s)
                    result = {"connect": "ok", "reply": reply}
                except ConnectionError as exc:  # closed (or reset) without a reply
                    result = {"connect": "ok", "closed": type(exc).__name__}
            result["pid"] = os.getpid()
            os.write(w, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_client_of_another_uid_is_refused(overmind_runtime):
    c = Client()
    c.status()
    sock = os.path.join(overmind_runtime, "server.sock")
    assert os.stat(overmind_runtime).st_mode & 0o777 == 0o700
    assert os.stat(sock).st_mode & 0o777 == 0o600

    # First line of defence: the 0700 runtime directory keeps other users from reaching the socket at all.
    assert _as_nobody(sock)["connect"] == "EACCES"

    # Second line: open the directory and socket up (a misconfiguration) and the server still refuses by
    # SO_PEERCRED, closing the connection without a reply and logging why.
    os.chmod(overmind_runtime, 0o711)
    os.chmod(sock, 0o666)
    try:
        seen = _as_nobody(sock)
    finally:
        os.chmod(sock, 0o600)
        os.chmod(overmind_runtime, 0o700)
    assert seen["connect"] == "ok"
    assert seen.get("closed") in ("ConnectionClosed", "BrokenPipeError"), seen
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert f"refused connection from pid {seen['pid']}: it runs as uid {NOBODY}" in f.read()
    assert c.status()["clients"] == 1, "the refused peer never counts as a client"


def test_second_server_for_the_same_dir_exits_with_a_clear_message(overmind_runtime):
    first = Client().status()["pid"]
    out = subprocess.run([sys.executable, "-m", "overmind.server", "--runtime-dir", overmind_runtime],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert f"another server (pid {first}) already serves {overmind_runtime}" in out.stderr
    assert "overmind stop" in out.stderr
    assert Client().status()["pid"] == first, "the running server is untouched and keeps its socket"


def test_stop_removes_the_socket_and_a_later_request_starts_a_new_server(overmind_runtime, sealed_memfd):
    c = Client()
    c.publish("k", sealed_memfd(b"x"))
    first = c.status()["pid"]
    assert c.stop() == {"pid": first}
    sock = os.path.join(overmind_runtime, "server.sock")
    assert not os.path.exists(sock) and server_lock_free(overmind_runtime)
    with pytest.raises(ServerUnavailable, match="overmind serve"):
        Client(autostart=False).status()
    with pytest.raises(ServerUnavailable):
        Client(autostart=False).stop()
    st = c.status()  # autostart
    assert st["pid"] != first and st["entries"] == 0


def test_killed_server_is_replaced_and_the_client_reconnects(overmind_runtime, sealed_memfd):
    c = Client()
    c.publish("k", sealed_memfd(b"x"))
    first = c.status()["pid"]
    os.kill(first, signal.SIGKILL)
    while not server_lock_free(overmind_runtime):  # the kernel drops the lock when the process dies
        os.sched_yield()
    assert os.path.exists(os.path.join(overmind_runtime, "server.sock")), "a stale socket file is left behind"
    res = c.get("k")  # the old connection is broken: reconnect once, starting a new server
    assert res.status == "claimed"
    assert c.status()["pid"] != first


def test_a_new_server_records_that_the_killed_one_lost_the_cache_and_status_shows_it(overmind_runtime):
    c = Client()
    first = c.status()["pid"]
    assert c.status()["last_lost"] is None  # a directory never served before
    c.stop()
    second = c.status()["pid"]  # after an orderly stop: nothing was lost
    assert c.status()["last_lost"] is None
    os.kill(second, signal.SIGKILL)
    while not server_lock_free(overmind_runtime):
        os.sched_yield()
    c = Client()
    st = c.status()
    assert st["pid"] not in (first, second)
    assert st["last_lost"]["pid"] == second and st["last_lost"]["noticed"] <= time.time()
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        log = f.read()
    assert f"the previous server (pid {first}) stopped in order" in log
    assert f"the previous server (pid {second}, started " in log and "ended without stopping" in log
    shown = subprocess.run([sys.executable, "-m", "overmind", "status"], capture_output=True, text=True,
                           timeout=120).stdout
    assert "the cache was last lost" in shown and f"(server pid {second} ended without stopping)" in shown
    c.stop()
    assert Client().status()["last_lost"]["pid"] == second  # carried on by the servers after it


def test_sigterm_stops_the_server_cleanly(overmind_runtime):
    pid = Client().status()["pid"]
    os.kill(pid, signal.SIGTERM)
    while not server_lock_free(overmind_runtime):
        os.sched_yield()
    assert not os.path.exists(os.path.join(overmind_runtime, "server.sock"))
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert "stopping: signal SIGTERM" in f.read()


def test_the_spawned_server_runs_without_site_and_imports_no_third_party_package(overmind_runtime):
    # python -S: no .pth processing (an editable install's finder), no sitecustomize; overmind comes from
    # PYTHONPATH (launcher.server_env), and the server needs nothing from site-packages.
    pid = Client().status()["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert argv[1:4] == [b"-S", b"-m", b"overmind.server"], argv
    with open(f"/proc/{pid}/maps") as f:
        mapped = f.read()
    assert "site-packages" not in mapped.replace(os.path.dirname(os.path.dirname(__import__("overmind").__file__)),
                                                 "<overmind>"), "the server mapped a third-party extension"


def test_failed_start_raises_server_unavailable_with_the_log_tail(overmind_runtime, monkeypatch):
    monkeypatch.setenv("PYTHONHOME", "/nonexistent")  # the server's interpreter cannot start (a bad setting does not stop it)
    with pytest.raises(ServerUnavailable) as info:
        Client().status()
    msg = str(info.value)
    assert "exited with status 1" in msg and "No module named 'encodings'" in msg
    assert "overmind serve" in msg
    assert not accepts(os.path.join(overmind_runtime, "server.sock"))


def test_many_clients_racing_to_start_the_server_start_exactly_one(overmind_runtime):
    script = "from overmind.client.connection import Client; print(Client().status()['pid'])"
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    pids = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(pids) == 1
