"""A process's first load begins the server's start before computing its key (``launcher.start_early``): the
start runs on a helper thread, the load's connection waits for that very start, a failed early start says nothing
(the load's own start reports it, in the load's one warning), and a child forked while this process holds the spawn
lock does not keep the lock."""
from __future__ import annotations

import fcntl
import os
import warnings

import overmind
from overmind import launcher, runtime
from overmind.client import Client


def test_start_early_returns_at_once_and_ensure_server_waits_for_that_start(overmind_runtime):
    sock = runtime.socket_path(overmind_runtime)
    assert not launcher.accepts(sock)
    launcher.start_early(overmind_runtime)
    helper = launcher._early[os.path.abspath(overmind_runtime)]
    assert helper.is_alive(), "the start runs on a helper thread, not in the call"
    assert helper.name == "overmind-server-start" and helper.daemon
    assert launcher.ensure_server(overmind_runtime) == sock
    assert not helper.is_alive()
    pid = Client(overmind_runtime).status()["pid"]
    launcher.start_early(overmind_runtime)  # a server accepts: nothing to start
    assert launcher._early[os.path.abspath(overmind_runtime)] is helper
    assert Client(overmind_runtime).status()["pid"] == pid


def _triple(x):
    return [x, x, x]


def test_the_first_load_starts_the_server_early_and_is_cached(overmind_runtime):
    assert overmind.load(_triple, 4) == [4, 4, 4]
    assert launcher._early[os.path.abspath(overmind_runtime)].name == "overmind-server-start"
    assert len(overmind.cache_info().entries) == 1
    assert overmind.load(_triple, 4) == [4, 4, 4]


def test_a_failed_early_start_is_silent_and_the_load_warns_once(overmind_runtime, monkeypatch):
    # The server's interpreter cannot start (the server runs with this environment): the early start fails on its
    # thread without a word; the load's own start fails too and says so in the load's one warning.
    monkeypatch.setenv("PYTHONHOME", "/nonexistent")
    monkeypatch.delenv("OVERMIND_STRICT", raising=False)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert overmind.load(_triple, 5) == [5, 5, 5]
    assert not launcher._early[os.path.abspath(overmind_runtime)].is_alive()
    messages = [str(w.message) for w in got]
    assert len(messages) == 1 and "the server is unavailable" in messages[0], messages
    assert "No module named 'encodings'" in messages[0] or "exited with status" in messages[0], messages


def test_a_child_forked_while_the_spawn_lock_is_held_does_not_keep_it(overmind_runtime):
    path = runtime.spawn_lock_path(runtime.runtime_dir(overmind_runtime))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    launcher._held.add(fd)  # as ensure_server holds it while a server starts
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
