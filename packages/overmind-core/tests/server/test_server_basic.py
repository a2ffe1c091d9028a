"""The server's request handling against a real server process: hit/claim/publish, seals, deps, status."""
from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys

import pytest

from overmind.client import connection as client_mod
from overmind.client.connection import Client
from overmind.errors import ProtocolMismatch, ServerError
from overmind.ipc.protocol import PROTOCOL_VERSION, ConnectionClosed, recv_message, send_message

READER = r"""
import json, mmap, sys
from overmind.client.connection import Client
res = Client().get(sys.argv[1], claim=False)
out = {"status": res.status, "entry": res.entry}
if res.status == "hit":
    fd = res.fds[res.entry["entry_id"]]
    with mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) as m:
        out["data"] = m[:].decode()
print(json.dumps(out))
"""


def _read(fd: int) -> bytes:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) as m:
        return m[:]


def _raw_connect(runtime_dir: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(runtime_dir, "server.sock"))
    return sock


def test_claim_publish_then_another_process_hits(overmind_runtime, sealed_memfd):
    c = Client()
    assert c.get("model-a").status == "claimed"
    entry_id = c.publish("model-a", sealed_memfd(b"weights of a"), meta={"loader": "test.loader"})
    assert entry_id.startswith("model-a-")

    out = subprocess.run([sys.executable, "-c", READER, "model-a"], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["status"] == "hit"
    assert seen["entry"] == {"entry_id": entry_id, "key": "model-a", "nbytes": len(b"weights of a"),
                             "meta": {"loader": "test.loader"}, "deps": []}
    assert seen["data"] == "weights of a"


def test_get_without_claim_is_a_miss_and_claims_nothing(overmind_runtime):
    a, b = Client(), Client()
    assert a.get("k", claim=False).status == "miss"
    assert b.get("k").status == "claimed", "a miss must not leave a claim behind"


def test_busy_when_not_waiting_or_timed_out(overmind_runtime):
    a, b = Client(), Client()
    assert a.get("k").status == "claimed"
    assert b.get("k", wait=False).status == "busy"
    assert b.get("k", timeout=0.05).status == "busy"


def test_same_connection_asking_again_keeps_its_claim(overmind_runtime):
    # A nested load of the key being loaded must not wait for itself.
    c = Client()
    assert c.get("k").status == "claimed"
    assert c.get("k").status == "claimed"


def test_unsealed_or_partly_sealed_memfd_is_refused(overmind_runtime, sealed_memfd):
    import fcntl

    c = Client()
    with pytest.raises(ServerError, match="F_SEAL_WRITE") as info:
        c.publish("k", sealed_memfd(b"x", seal=False))
    assert info.value.reason == "not sealed"
    with pytest.raises(ServerError, match="F_SEAL_SHRINK") as info:
        c.publish("k", sealed_memfd(b"x", seals=fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW))
    assert info.value.reason == "not sealed"
    assert c.ls() == []


def test_a_regular_file_is_refused_as_not_a_memfd(overmind_runtime, tmp_path):
    c = Client()
    with open(tmp_path / "f", "wb+") as f:
        f.write(b"data")
        f.flush()
        with pytest.raises(ServerError, match="not a memfd") as info:
            c.publish("k", f.fileno())
    assert info.value.reason == "not sealed"


def test_publish_leaves_the_callers_fd_open_and_second_publish_returns_the_first(overmind_runtime, sealed_memfd):
    c = Client()
    fd1, fd2 = sealed_memfd(b"one"), sealed_memfd(b"two")
    first = c.publish("k", fd1)
    os.fstat(fd1)  # still open in the caller
    assert c.publish("k", fd2) == first
    hit = c.get("k")
    assert _read(hit.fds[first]) == b"one"
    hit.close()
    assert len(c.ls()) == 1


def test_entry_ids_are_unique_per_publish(overmind_runtime, sealed_memfd):
    c = Client()
    first = c.publish("same-long-key-prefix-1", sealed_memfd(b"a"))
    c.evict("same-long-key-prefix-1")
    second = c.publish("same-long-key-prefix-1", sealed_memfd(b"a"))
    third = c.publish("same-long-key-prefix-2", sealed_memfd(b"b"))
    assert len({first, second, third}) == 3


def test_hit_carries_entry_fd_first_then_transitive_deps(overmind_runtime, sealed_memfd):
    c = Client()
    base = c.publish("base", sealed_memfd(b"base"))
    mid = c.publish("mid", sealed_memfd(b"mid"), deps=[base])
    top = c.publish("top", sealed_memfd(b"top"), deps=[mid, base])
    hit = c.get("top")
    assert hit.entry["deps"] == [mid, base]
    assert list(hit.fds) == [top, mid, base]
    assert [_read(fd) for fd in hit.fds.values()] == [b"top", b"mid", b"base"]
    hit.close()


def test_publish_with_a_missing_dep_is_refused(overmind_runtime, sealed_memfd):
    c = Client()
    with pytest.raises(ServerError, match="not .*cached") as info:
        c.publish("k", sealed_memfd(b"x"), deps=["nope-1"])
    assert info.value.reason == "dep missing"


def test_fds_op_returns_fds_in_order_and_refuses_unknown_ids(overmind_runtime, sealed_memfd):
    c = Client()
    a = c.publish("a", sealed_memfd(b"A"))
    b = c.publish("b", sealed_memfd(b"B"))
    fds = c.fds([b, a])
    assert list(fds) == [b, a]
    assert [_read(fd) for fd in fds.values()] == [b"B", b"A"]
    for fd in fds.values():
        os.close(fd)
    with pytest.raises(ServerError, match="not cached"):
        c.fds([a, "gone-7"])


def test_ls_reports_hits_meta_deps_and_referents(overmind_runtime, sealed_memfd):
    c = Client()
    base = c.publish("base", sealed_memfd(b"12345"), meta={"loader": "L", "summary": "s"})
    top = c.publish("top", sealed_memfd(b"x"), deps=[base])
    c.get("base").close()
    c.get("base").close()
    rows = {r["key"]: r for r in c.ls()}
    assert rows["base"]["hits"] == 2 and rows["base"]["nbytes"] == 5
    assert rows["base"]["meta"] == {"loader": "L", "summary": "s"}
    assert rows["base"]["referenced_by"] == [top]
    assert rows["top"]["deps"] == [base]


def test_status_fields_and_the_server_never_imports_torch(overmind_runtime, sealed_memfd):
    c = Client()
    c.publish("k", sealed_memfd(b"x" * 100))
    c.get("k").close()
    st = c.status()
    assert st["torch_imported"] is False
    assert st["protocol"] == PROTOCOL_VERSION and st["entries"] == 1 and st["bytes"] == 100
    assert st["runtime_dir"] == overmind_runtime and st["clients"] == 1
    assert {"pid", "uptime", "version", "max_bytes"} <= set(st)
    with open(f"/proc/{st['pid']}/maps") as f:
        assert "torch" not in f.read()


def test_protocol_mismatch_is_refused_and_the_connection_closed(overmind_runtime):
    Client().status()  # start the server
    sock = _raw_connect(overmind_runtime)
    try:
        send_message(sock, {"op": "hello", "protocol": 999, "pid": os.getpid(), "version": "9"})
        reply, _ = recv_message(sock)
        assert reply["ok"] is False and reply["reason"] == "protocol" and reply["protocol"] == PROTOCOL_VERSION
        assert "overmind stop" in reply["error"]
        with pytest.raises(ConnectionClosed):
            recv_message(sock)
    finally:
        sock.close()


def test_client_raises_protocol_mismatch(overmind_runtime, monkeypatch):
    Client().status()
    monkeypatch.setattr(client_mod, "PROTOCOL_VERSION", 999)
    with pytest.raises(ProtocolMismatch, match="protocol 999"):
        Client().status()


def test_first_request_must_be_hello(overmind_runtime):
    Client().status()
    sock = _raw_connect(overmind_runtime)
    try:
        send_message(sock, {"op": "status"})
        reply, _ = recv_message(sock)
        assert reply["ok"] is False and "hello" in reply["error"]
    finally:
        sock.close()


def test_bad_requests_get_errors_and_the_connection_survives(overmind_runtime, sealed_memfd):
    c = Client()
    with pytest.raises(ServerError, match="unknown op") as info:
        c._request({"op": "frobnicate"})
    assert info.value.reason == "bad request"
    with pytest.raises(ServerError, match="exactly one fd"):
        c._request({"op": "publish", "key": "k"})
    with pytest.raises(ServerError, match="'key'"):
        c._request({"op": "get", "key": 3})
    assert c.status()["clients"] == 1
