"""Client connection layer and runtime directory: per-thread connections, fork safety, safe directories."""
from __future__ import annotations

import json
import os
import threading

import pytest

from overmind.client import connection as client_mod
from overmind.client.connection import Client, get_client
from overmind.errors import OvermindError, RuntimeDirError, ServerUnavailable
from overmind.ipc import runtime


# ---- runtime directory ---------------------------------------------------------------------------------
def test_runtime_dir_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runtime.default_runtime_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("OVERMIND_RUNTIME_DIR")
    assert runtime.default_runtime_dir() == str(tmp_path / "overmind")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert runtime.default_runtime_dir() == f"/tmp/overmind-{os.getuid()}"


def test_runtime_dir_is_created_0700(tmp_path):
    path = runtime.runtime_dir(str(tmp_path / "a" / "b"))
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert runtime.socket_path(path) == os.path.join(path, "server.sock")
    assert runtime.log_path(path) == os.path.join(path, "server.log")


def test_runtime_dir_with_group_or_other_access_is_refused(tmp_path):
    path = tmp_path / "open"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o750)
    with pytest.raises(RuntimeDirError, match=f"chmod 700 {path}"):
        runtime.runtime_dir(str(path))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another user")
def test_runtime_dir_of_another_user_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeDirError, match="belongs to uid 65534") as info:
        Client(str(path))
    assert "OVERMIND_RUNTIME_DIR" in str(info.value)


def test_runtime_dir_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(RuntimeDirError, match="not a directory"):
        runtime.runtime_dir(str(tmp_path / "link"))


def test_too_long_socket_path_names_the_fix(tmp_path):
    deep = tmp_path / ("d" * 100)
    with pytest.raises(RuntimeDirError, match="shorter directory"):
        runtime.socket_path(str(deep))


# ---- connections -----------------------------------------------------------------------------------------
def test_no_server_and_no_autostart_says_what_to_do(overmind_runtime):
    with pytest.raises(ServerUnavailable, match="overmind serve") as info:
        Client(autostart=False).status()
    assert isinstance(info.value, OvermindError)


def test_a_listening_server_is_connected_to_at_once_and_a_missing_one_is_started(overmind_runtime, monkeypatch):
    from overmind.client import launcher

    probes = []
    accepts = launcher.accepts
    monkeypatch.setattr(launcher, "accepts", lambda path: probes.append(path) or accepts(path))
    first = Client()
    assert first.status()["clients"] == 1  # no server: it was started, then connected to
    assert probes, "starting the server asks whether one listens"
    probes.clear()
    second = Client()
    assert second.status()["clients"] == 2
    assert probes == []  # a server that answers: one connection, no probe before it
    third = Client()
    assert third.claim_by_starting("k") is False  # a first load's question: the server runs, ask it
    assert probes == [] and len(third._conns) == 1  # on the connection the get will use
    assert third.get("k").status == "claimed" and len(third._conns) == 1
    for c in (first, second, third):
        c.close()


def test_each_thread_gets_its_own_connection(overmind_runtime):
    c = Client()
    assert c.status()["clients"] == 1
    seen = []
    t = threading.Thread(target=lambda: seen.append(c.status()["clients"]))
    t.start()
    t.join()
    assert seen == [2]
    assert len(c._conns) == 2
    c.close()
    assert c._conns == [], "close() closes every connection of the client"
    assert c.status()["runtime_dir"] == overmind_runtime, "and the client reconnects on the next request"


def test_claim_belongs_to_the_thread_that_got_it(overmind_runtime):
    c = Client()
    assert c.get("k").status == "claimed"
    other: list = []
    t = threading.Thread(target=lambda: other.append(c.get("k", wait=False).status))
    t.start()
    t.join()
    assert other == ["busy"]


def test_get_client_is_a_per_process_singleton_per_runtime_dir(overmind_runtime, monkeypatch, tmp_path):
    a = get_client()
    assert get_client() is a and a.runtime_dir == overmind_runtime
    other = tmp_path / "rt"
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", str(other))
    b = get_client()
    assert b is not a and b.runtime_dir == str(other)
    client_mod._clients.pop(str(other)).close()


def test_forked_child_opens_its_own_connection(overmind_runtime):
    c = get_client()
    parent_conn = c._connection()
    assert c.status()["clients"] == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not talk on the parent's socket
        try:
            child = get_client()
            st = child.status()
            os.write(w, json.dumps({"same": child is c, "clients": st["clients"],
                                    "own": child._connection() is not parent_conn}).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    assert seen == {"same": True, "clients": 2, "own": True}
    assert c._connection() is parent_conn
    assert c.status()["runtime_dir"] == overmind_runtime, "the parent's connection still works"


def test_get_result_owns_its_fds(overmind_runtime, sealed_memfd):
    c = Client()
    c.publish("k", sealed_memfd(b"data"))
    res = c.get("k")
    fd = next(iter(res.fds.values()))
    os.fstat(fd)
    res.close()
    assert res.fds == {}
    with pytest.raises(OSError):
        os.fstat(fd)


def test_evict_needs_a_key_or_all(overmind_runtime):
    with pytest.raises(ValueError):
        Client().evict()
