"""Claims under concurrency against a real server: 64 clients, singleflight, crashed claimers, release."""
from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict

from overmind.client.connection import Client

# A client process: get KEY; if claimed, optionally hang (to be killed) or wait for N waiters, then publish
# a sealed memfd holding "payload-<pid>"; if hit, print what the mapping holds. One JSON line per step.
LOADER = r"""
import fcntl, json, mmap, os, sys, time
from overmind.client.connection import Client
key, mode = sys.argv[1], sys.argv[2]
c = Client()
res = c.get(key)
print(json.dumps({"status": res.status, "pid": os.getpid(),
                  "entry_id": res.entry and res.entry["entry_id"]}), flush=True)
if res.status == "claimed":
    if mode == "hang":
        time.sleep(3600)
    if mode.startswith("waiters="):
        want, deadline = int(mode.split("=")[1]), time.monotonic() + 120
        while c.status()["waiting"] < want and time.monotonic() < deadline:
            time.sleep(0.01)
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.write(fd, f"payload-{os.getpid()}".encode())
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    print(json.dumps({"published": c.publish(key, fd)}), flush=True)
elif res.status == "hit":
    with mmap.mmap(res.fds[res.entry["entry_id"]], 0, access=mmap.ACCESS_COPY) as m:
        print(json.dumps({"data": m[:].decode()}), flush=True)
"""


def _spawn(key: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LOADER, key, mode], stdout=subprocess.PIPE, text=True)


def _wait_for_waiters(client: Client, n: int) -> None:
    # Bounded by pytest-timeout; this is a rendezvous, not a timing assertion.
    while client.status()["waiting"] < n:
        threading.Event().wait(0.01)


def _read(fd: int) -> bytes:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) as m:
        return m[:]


def test_64_concurrent_clients_each_hello_get_and_publish_or_hit(overmind_runtime, sealed_memfd):
    n, keys = 64, 8
    client = Client()  # shared: each thread gets its own connection
    client.status()
    connected, go = threading.Barrier(n + 1), threading.Barrier(n + 1)
    results: list = [None] * n
    errors: list = []

    def worker(i: int) -> None:
        try:
            client.status()  # connect + hello
            connected.wait()
            go.wait()
            key = f"shared-{i % keys}"
            res = client.get(key)
            if res.status == "claimed":
                results[i] = (key, "claimed", client.publish(key, sealed_memfd(key.encode())), key.encode())
            else:
                eid = res.entry["entry_id"]
                results[i] = (key, res.status, eid, _read(res.fds[eid]))
                res.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            connected.abort()
            go.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    connected.wait()
    assert client.status()["clients"] == n + 1  # every worker holds its own connection, plus ours
    go.wait()
    for t in threads:
        t.join()
    assert not errors, errors
    by_key = defaultdict(list)
    for key, status, eid, data in results:
        by_key[key].append((status, eid, data))
    assert len(by_key) == keys
    for key, rows in by_key.items():
        assert [s for s, _, _ in rows].count("claimed") == 1, rows
        assert {s for s, _, _ in rows} == {"claimed", "hit"}
        assert len({eid for _, eid, _ in rows}) == 1, "everyone must get the claimer's entry"
        assert {d for _, _, d in rows} == {key.encode()}
    assert client.status()["entries"] == keys


def test_singleflight_across_processes_one_claims_the_rest_hit(overmind_runtime):
    n = 8
    Client().status()
    procs = [_spawn("one-key", f"waiters={n - 1}") for _ in range(n)]
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lines = [[json.loads(line) for line in out.splitlines()] for out in outs]
    claimers = [ls for ls in lines if ls[0]["status"] == "claimed"]
    assert len(claimers) == 1, lines
    entry_id = claimers[0][1]["published"]
    payload = f"payload-{claimers[0][0]['pid']}"
    others = [ls for ls in lines if ls[0]["status"] != "claimed"]
    assert [ls[0]["status"] for ls in others] == ["hit"] * (n - 1)
    assert {ls[0]["entry_id"] for ls in others} == {entry_id}
    assert {ls[1]["data"] for ls in others} == {payload}


def test_claimer_killed_mid_load_releases_its_claim_to_a_waiter(overmind_runtime):
    watcher = Client()
    watcher.status()
    claimer = _spawn("k", "hang")
    try:
        assert json.loads(claimer.stdout.readline())["status"] == "claimed"
        waiter = _spawn("k", "publish")
        _wait_for_waiters(watcher, 1)
    finally:
        claimer.send_signal(signal.SIGKILL)
        claimer.wait()
        claimer.stdout.close()
    out, _ = waiter.communicate()
    first, second = [json.loads(line) for line in out.splitlines()]
    assert first["status"] == "claimed"
    hit = watcher.get("k", claim=False)
    assert hit.status == "hit" and hit.entry["entry_id"] == second["published"]
    assert _read(hit.fds[second["published"]]) == f"payload-{first['pid']}".encode()
    hit.close()
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert f"pid {claimer.pid}) closed holding claims on 1 keys" in f.read()


def test_release_hands_the_claim_to_one_waiter(overmind_runtime, sealed_memfd):
    loader, watcher = Client(), Client()
    assert loader.get("k").status == "claimed"
    got: dict = {}
    waiters = [Client() for _ in range(3)]

    def wait(i: int) -> None:
        got[i] = waiters[i].get("k").status
        if got[i] == "claimed":
            waiters[i].publish("k", sealed_memfd(b"second try"))

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    _wait_for_waiters(watcher, 3)
    assert loader.release("k") is True
    for t in threads:
        t.join()
    assert sorted(got.values()) == ["claimed", "hit", "hit"]
    assert loader.release("k") is False, "the claim is gone; releasing again does nothing"


def test_waiter_with_timeout_gets_busy_and_the_claim_stays(overmind_runtime):
    loader, other = Client(), Client()
    assert loader.get("k").status == "claimed"
    assert other.get("k", timeout=0.1).status == "busy"
    assert other.get("k", wait=False).status == "busy"
    assert other.status()["claims"] == 1
