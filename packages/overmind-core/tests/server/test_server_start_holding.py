"""A process's first load with no server running starts the server holding that load's key for it
(``launcher.start_holding``, ``server/handoff.py``): the loader runs at once, while the server starts; every other
process asking for the key waits for this one's publish; the claim goes when that process ends; only the server's
parent may name such a claim; a server that cannot start is the load's one warning; and a child forked while this
process holds the spawn lock does not keep the lock."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import overmind
from overmind import testing
from overmind.client import launcher
from overmind.client.connection import Client
from overmind.client.launcher import server_env
from overmind.ipc import runtime


def _other_process_get(rt: str, key: str, wait: bool, timeout: float = 0.0) -> str:
    """The status another process gets for ``key`` (claiming it)."""
    code = textwrap.dedent(f"""
        from overmind.client.connection import Client
        print(Client({rt!r}).get({key!r}, claim=True, wait={wait!r}, timeout={timeout!r}).status)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def test_start_holding_spawns_the_server_with_the_key_claimed_for_this_process(overmind_runtime):
    sock = runtime.socket_path(overmind_runtime)
    assert not launcher.accepts(sock)
    assert launcher.start_holding(overmind_runtime, "k1") is True
    helper = launcher._starting[os.path.abspath(overmind_runtime)]
    assert helper.name == "overmind-server-start" and helper.daemon
    assert launcher.ensure_server(overmind_runtime) == sock  # waits for that very start
    assert not helper.is_alive()
    assert _other_process_get(overmind_runtime, "k1", wait=False) == "busy"  # held for this process
    assert _other_process_get(overmind_runtime, "k2", wait=False) == "claimed"  # only that key
    mine = Client(overmind_runtime)
    try:
        assert mine.get("k1", claim=True, wait=False).status == "claimed"  # this process's connection takes it over
        assert mine.release("k1") is True
        assert _other_process_get(overmind_runtime, "k1", wait=False) == "claimed"
        pid = mine.status()["pid"]
        assert launcher.start_holding(overmind_runtime, "k3") is False  # a server accepts: nothing spawned
        assert mine.status()["pid"] == pid
        assert _other_process_get(overmind_runtime, "k3", wait=False) == "claimed"
    finally:
        mine.close()


def test_nothing_is_spawned_while_another_start_holds_the_spawn_lock(overmind_runtime):
    directory = runtime.runtime_dir(overmind_runtime)
    fd = os.open(runtime.spawn_lock_path(directory), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a process starting the server holds it
        assert launcher.start_holding(overmind_runtime, "k") is False
        assert not launcher.server_pids(directory)
    finally:
        os.close(fd)


def test_the_claim_goes_when_the_spawner_exits_without_loading(overmind_runtime):
    # The spawner starts the server holding "k", waits until it accepts, and dies without a word to it: a process
    # waiting on "k" then gets the claim (the server watches the spawner through a pidfd), instead of hanging.
    code = textwrap.dedent(f"""
        import os, sys
        from overmind.client import launcher
        assert launcher.start_holding({overmind_runtime!r}, "k")
        launcher.ensure_server({overmind_runtime!r})
        print("up", flush=True)
        sys.stdin.read()
        os._exit(0)
    """)
    spawner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert spawner.stdout.readline().strip() == "up"
        assert _other_process_get(overmind_runtime, "k", wait=False) == "busy"
        waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            from overmind.client.connection import Client
            print(Client({overmind_runtime!r}).get("k", claim=True, wait=True, timeout=60).status)
        """)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # the waiter is parked on the spawner's claim (if not yet, it claims at once: same answer)
        spawner.stdin.close()
        assert spawner.wait(60) == 0
        assert waiter.communicate(timeout=60)[0].strip() == "claimed"
    finally:
        spawner.kill()
        spawner.wait()
    with open(runtime.log_path(overmind_runtime)) as f:
        assert "which started the server, closed holding claims on 1 keys" in f.read()


def test_a_server_holds_no_claim_for_a_process_that_is_not_its_parent(overmind_runtime):
    # pid 1 did not start this server: the server says so in its log and holds nothing.
    proc = subprocess.Popen([sys.executable, "-S", "-m", "overmind.server", "--runtime-dir", overmind_runtime,
                             "--claim", "k", "--claim-pid", "1"], env=server_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert launcher.wait_accepting(runtime.socket_path(overmind_runtime), 60)
        assert _other_process_get(overmind_runtime, "k", wait=False) == "claimed"
        with open(runtime.log_path(overmind_runtime)) as f:
            assert "not holding key k for pid 1: only the process that started the server" in f.read()
    finally:
        Client(overmind_runtime, autostart=False).stop()
        proc.wait(60)


SPAWNER_AND_WAITER = '''
import os, sys, time
import overmind
from overmind.client import launcher
from overmind.ipc import runtime
from overmind import testing
from overmind.client.connection import get_client
from overmind.testing import report

def build(tag):
    client = get_client()
    seen = {"connections": len(client._conns), "server_up": launcher.accepts(runtime.socket_path(client.runtime_dir))}
    with open(os.environ["LOAD_LOG"], "a") as f:
        f.write(f"load {os.getpid()}\\n")
    open(os.environ["LOADING_FLAG"], "w").close()
    time.sleep(float(os.environ.get("LOAD_SLEEP", "0")))
    return {"tag": tag, "seen": seen}

if os.environ.get("WAIT_FOR_FLAG"):
    while not os.path.exists(os.environ["LOADING_FLAG"]):
        time.sleep(0.01)
report(overmind.load(build, "one"))
'''


def test_the_spawners_loader_runs_before_any_connection_and_the_other_process_waits_for_it(overmind_runtime,
                                                                                            tmp_path):
    script = tmp_path / "spawner_and_waiter.py"
    script.write_text(SPAWNER_AND_WAITER)
    log = tmp_path / "loads.log"
    env = {**os.environ, "LOAD_LOG": str(log), "LOADING_FLAG": str(tmp_path / "loading"), "OVERMIND_STRICT": "1"}
    spawner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               env={**env, "LOAD_SLEEP": "1.5"})
    waiter = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**env, "WAIT_FOR_FLAG": "1"})  # asks once the spawner's loader runs
    outs = [p.communicate(timeout=300)[0] for p in (spawner, waiter)]
    assert [p.returncode for p in (spawner, waiter)] == [0, 0], outs
    first, second = (_reported(o) for o in outs)
    assert first == second
    assert first["seen"]["connections"] == 0  # the spawner asked the server nothing before loading
    assert log.read_text().split() == ["load", str(spawner.pid)]  # the waiter took the spawner's entry


def _reported(stdout: str):
    line = next(ln for ln in stdout.splitlines() if ln.startswith(testing.RESULT_MARK))
    return json.loads(line[len(testing.RESULT_MARK):])


def _triple(x):
    return [x, x, x]


def test_a_server_that_cannot_start_is_the_loads_one_warning(overmind_runtime, monkeypatch):
    # The server's interpreter cannot start (the server runs with this environment): the load that spawned it runs
    # its loader meanwhile, its publish finds no server, and the load says so once, returning the plain result.
    monkeypatch.setenv("PYTHONHOME", "/nonexistent")
    monkeypatch.delenv("OVERMIND_STRICT", raising=False)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert overmind.load(_triple, 5) == [5, 5, 5]
    assert not launcher._starting[os.path.abspath(overmind_runtime)].is_alive()
    messages = [str(w.message) for w in got]
    assert len(messages) == 1 and "the server is unavailable" in messages[0], messages
    assert "loaded" in messages[0] and "_triple without the cache" in messages[0], messages
    assert "No module named 'encodings'" in messages[0] or "exited with status" in messages[0], messages


def test_the_first_load_starts_the_server_and_is_cached(overmind_runtime):
    assert overmind.load(_triple, 4) == [4, 4, 4]
    assert launcher._starting[os.path.abspath(overmind_runtime)].name == "overmind-server-start"
    assert len(overmind.cache_info().entries) == 1
    assert overmind.load(_triple, 4) == [4, 4, 4]


def test_a_child_forked_while_the_spawn_lock_is_held_does_not_keep_it(overmind_runtime):
    path = runtime.spawn_lock_path(runtime.runtime_dir(overmind_runtime))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    launcher._held.add(fd)  # as start_holding and ensure_server hold it while a server starts
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the at-fork hook closed its copy of the lock's fd
        try:
            try:
                os.fstat(fd)
                os.write(report_w, b"open")
            except OSError:
                os.write(report_w, b"closed")
            os.read(go_r, 1)  # alive until the parent has tried the lock
        finally:
            os._exit(0)
    try:
        assert os.read(report_r, 16) == b"closed"
        launcher._held.discard(fd)
        os.close(fd)  # the parent's start is over: the lock is free, though the child still runs
        other = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if the child kept the lock
        finally:
            os.close(other)
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        for end in (report_r, report_w, go_r, go_w):
            os.close(end)

