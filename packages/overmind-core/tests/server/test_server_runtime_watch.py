"""The server watches its runtime directory: a tmp cleaner removing the socket (or the lock with
it) costs a client well under a second, never the 16 s start timeout; removing the whole directory makes the
old server exit and free its memory, and the next load starts a new one."""
from __future__ import annotations

import os
import shutil
import stat
import time

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import server_pids


@pytest.fixture
def served(overmind_runtime, sealed_memfd, monkeypatch):
    """A running server holding one entry ``k``; ``(pid, entry_id)``. A start that takes more than 5 s fails
    (a server that does not come back would otherwise show as a 15 s wait and an uncached load)."""
    monkeypatch.setenv("OVERMIND_SERVER_START_TIMEOUT", "5")
    c = Client()
    entry_id = c.publish("k", sealed_memfd(b"the entry"))
    pid = c.status()["pid"]
    c.close()
    return pid, entry_id


def _first_request_time(key: str = "k") -> tuple[float, dict, object]:
    """A brand-new client (a new process would be the same) asks for ``key``: (seconds, status, get result)."""
    c = Client()
    t0 = time.monotonic()
    res = c.get(key, claim=False)
    took = time.monotonic() - t0
    st = c.status()
    res.close()
    c.close()
    return took, st, res


def _replace_with_file(path: str) -> None:
    os.unlink(path)
    with open(path, "w") as f:
        f.write("not a socket")


@pytest.mark.parametrize("cleaner", [os.unlink, _replace_with_file], ids=["removed", "replaced-by-a-file"])
def test_socket_removed_or_replaced_is_recreated_within_a_second(served, overmind_runtime, cleaner):
    pid, entry_id = served
    sock = os.path.join(overmind_runtime, "server.sock")
    cleaner(sock)
    took, st, res = _first_request_time()
    assert st["pid"] == pid, "the same server keeps serving, with its entries"
    assert res.status == "hit" and res.entry["entry_id"] == entry_id
    assert took < 1.0, f"a client waited {took:.2f} s for the socket to come back"
    mode = os.lstat(sock).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert "re-created the socket" in f.read()


@pytest.mark.parametrize("cleaner", [os.unlink, _replace_with_file], ids=["removed", "replaced-by-a-file"])
def test_a_processs_first_load_meanwhile_waits_for_the_socket_and_hits(served, overmind_runtime, cleaner):
    # A process's first load asks claim_by_starting before its get: it must find the running server too
    pid, entry_id = served
    cleaner(os.path.join(overmind_runtime, "server.sock"))
    c = Client()
    t0 = time.monotonic()
    assert c.claim_by_starting("k") is False, "a server runs: nothing to start, nothing claimed"
    res = c.get("k", claim=False)
    took = time.monotonic() - t0
    assert res.status == "hit" and res.entry["entry_id"] == entry_id and c.status()["pid"] == pid
    assert took < 1.0, f"the first load waited {took:.2f} s"
    res.close()
    c.close()


def test_every_file_removed_by_a_cleaner_recovers_with_one_server(served, overmind_runtime):
    """Socket, lock files and log gone (systemd-tmpfiles on /tmp): one server serves afterwards, quickly."""
    pid, _ = served
    for name in os.listdir(overmind_runtime):
        os.unlink(os.path.join(overmind_runtime, name))
    took, st, _res = _first_request_time()
    assert took < 1.0, f"a client waited {took:.2f} s"
    deadline = time.monotonic() + 5
    while len(server_pids(overmind_runtime)) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(overmind_runtime) == [st["pid"]], "exactly one server is left for the directory"
    assert os.path.exists(os.path.join(overmind_runtime, "server.log")), "the log is written again"
    # The lock on the path is held by the server that serves: a manual second start is refused.
    again = Client().status()
    assert again["pid"] == st["pid"]


def test_runtime_dir_removed_the_old_server_exits_and_a_new_one_serves(served, overmind_runtime):
    pid, _ = served
    shutil.rmtree(overmind_runtime)
    deadline = time.monotonic() + 5
    while pid in server_pids(overmind_runtime) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid not in server_pids(overmind_runtime), "the old server still runs, unreachable, holding its memory"
    st = Client().status()  # the directory is created again and a new server starts
    assert st["pid"] != pid and st["entries"] == 0
    assert stat.S_IMODE(os.stat(overmind_runtime).st_mode) == 0o700


def test_runtime_dir_replaced_the_old_server_exits(served, overmind_runtime):
    """A directory removed and created again (by a new client) is not the old server's: it leaves."""
    pid, _ = served
    shutil.rmtree(overmind_runtime)
    os.mkdir(overmind_runtime, 0o700)
    st = Client().status()
    assert st["pid"] != pid
    deadline = time.monotonic() + 5
    while pid in server_pids(overmind_runtime) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(overmind_runtime) == [st["pid"]]
    assert Client().status()["pid"] == st["pid"], "the old server did not take the new server's socket"
