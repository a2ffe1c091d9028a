"""Soak: many processes loop ``overmind.load`` over shared and private keys and over
results of earlier loads, with a timer signal raising in the middle of loads, the server SIGKILLed and
restarted under them, and a budget small enough to force evictions all the time. It ends with zero wrong
objects (every result checked against a value recomputed without Overmind), zero errors, zero hangs (every
process finishes within a bound) and a server whose fds and memory are back where they started.

Bounded: ``OVERMIND_SOAK_PROCS`` processes (default 8; the issue names 32, which on a 2-core machine spends
most of its time importing torch), ``OVERMIND_SOAK_LOADS`` loads each per phase (default 30), about a
minute on 2 cores.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import server_lock_free, server_pids
from overmind.testing import RESULT_MARK

PROCS = int(os.environ.get("OVERMIND_SOAK_PROCS", "8"))
LOADS = int(os.environ.get("OVERMIND_SOAK_LOADS", "30"))
BUDGET = 384 << 10  # ~20 entries of 16 KiB: evictions all the time
PHASE_BOUND_S = 150.0  # every process of a phase finishes within this, or it hung

LOADERS = '''
import time
import torch

def make(seed, n):
    time.sleep(0.002 * (seed % 5))  # a loader that takes a moment, so that signals land inside loads too
    g = torch.Generator().manual_seed(seed)
    return {"seed": seed, "t": torch.randn(n, generator=g)}

def double(obj):
    return {"src": obj["t"], "y": obj["t"] * 2}
'''

WORKER = '''
import json, os, random, signal, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch, overmind, soak_loaders as L
from overmind.testing import report

class Interrupt(BaseException):
    """What a notebook's Ctrl-C or a signal-based timeout raises in the middle of whatever runs."""

def on_alarm(signum, frame):
    raise Interrupt()

signal.signal(signal.SIGALRM, on_alarm)
warnings.simplefilter("ignore")
index, loads = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(index)
N = 4096
stats = {"ok": 0, "wrong": [], "errors": [], "interrupted": 0}

def expected(seed):
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))

def check(seed, got, derived):
    want = expected(seed)
    if derived:
        good = isinstance(got, dict) and torch.equal(got["y"], want * 2) and torch.equal(got["src"], want)
    else:
        good = isinstance(got, dict) and got.get("seed") == seed and torch.equal(got["t"], want)
    if good:
        stats["ok"] += 1
    else:
        stats["wrong"].append((seed, derived))

held = []
for i in range(loads):
    shared = rng.random() < 0.6
    seed = rng.randrange(8) if shared else 1000 + index * 1000 + i
    derived = bool(held) and rng.random() < 0.25
    alarm = rng.random() < 0.3
    try:
        try:
            if alarm:  # inside the try: a short alarm can fire as setitimer returns, on a busy machine
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0005, 0.02))
            if derived:
                seed, base = rng.choice(held)
                got = overmind.load(L.double, base)
            else:
                got = overmind.load(L.make, seed, N)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Interrupt:
        stats["interrupted"] += 1
        continue
    except Exception as exc:
        stats["errors"].append(f"{type(exc).__name__}: {exc}"[:300])
        continue
    check(seed, got, derived)
    if not derived:
        held = (held + [(seed, got)])[-4:]  # keep a few results alive, free the rest
del held, got
report(stats)
'''


def _server_usage(pid: int) -> dict:
    """The server's fds, how many of them are memfds and their bytes, and its RSS."""
    fds = memfds = memfd_bytes = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith("/memfd:"):
                memfds += 1
                memfd_bytes += os.stat(f"/proc/{pid}/fd/{name}").st_size
        except OSError:
            pass
    with open(f"/proc/{pid}/status") as f:
        rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"fds": fds, "memfds": memfds, "memfd_bytes": memfd_bytes, "rss_kib": rss_kib}


def _kill_server(runtime_dir: str) -> None:
    for pid in server_pids(runtime_dir):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not server_lock_free(runtime_dir) and time.monotonic() < deadline:
        time.sleep(0.01)


def _run_phase(tmp_path, phase: str, kill_every: float | None, runtime_dir: str) -> list[dict]:
    script = tmp_path / "soak_worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(i + (1000 if phase == "B" else 0)),
                               str(LOADS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(PROCS)]
    deadline = time.monotonic() + PHASE_BOUND_S
    kills = 0
    next_kill = time.monotonic() + (kill_every or 0)
    while kill_every and any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if time.monotonic() >= next_kill:
            _kill_server(runtime_dir)
            kills += 1
            next_kill = time.monotonic() + kill_every
        time.sleep(0.05)
    results, hung = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            hung.append(err[-2000:])
            continue
        reports = [line[len(RESULT_MARK):] for line in out.splitlines() if line.startswith(RESULT_MARK)]
        assert p.returncode == 0 and reports, f"phase {phase}: a worker failed (exit {p.returncode}):\n{err[-3000:]}"
        results.append(json.loads(reports[-1]))
    assert not hung, f"phase {phase}: {len(hung)} of {PROCS} workers hung past {PHASE_BOUND_S:g} s:\n{hung[0]}"
    if kill_every:
        assert kills >= 2, f"phase {phase}: the server was killed only {kills} times; the phase ended too soon"
    return results


def _check(results: list[dict], phase: str) -> None:
    print(f"soak phase {phase}: {PROCS} processes, {sum(r['ok'] for r in results)} loads checked right, "
          f"{sum(r['interrupted'] for r in results)} interrupted, "
          f"{sum(len(r['wrong']) for r in results)} wrong, {sum(len(r['errors']) for r in results)} raised")
    wrong = [w for r in results for w in r["wrong"]]
    errors = [e for r in results for e in r["errors"]]
    assert not wrong, f"phase {phase}: {len(wrong)} wrong objects (seed, derived): {wrong[:10]}"
    assert not errors, f"phase {phase}: {len(errors)} loads raised: {errors[:5]}"
    assert sum(r["ok"] for r in results) > PROCS * LOADS // 2, results
    assert sum(r["interrupted"] for r in results) > 0, "no load was interrupted: the soak tests less than it says"


@pytest.mark.timeout(420)
def test_soak_many_processes_interrupts_kills_and_evictions(overmind_runtime, tmp_path, monkeypatch):
    (tmp_path / "soak_loaders.py").write_text(textwrap.dedent(LOADERS))
    monkeypatch.setenv("OVERMIND_MAX_BYTES", str(BUDGET))
    monkeypatch.setenv("OVERMIND_WAIT_TIMEOUT", "20")
    Client().status()

    # Phase A: the server is SIGKILLed under the workers every 1.5 s.
    _check(_run_phase(tmp_path, "A", 1.5, overmind_runtime), "A")

    # Phase B: one fresh server; its fds and memory are measured before and after the workers' loads.
    _kill_server(overmind_runtime)
    admin = Client()
    pid = admin.status()["pid"]
    admin.close()
    time.sleep(0.2)
    start = _server_usage(pid)
    results = _run_phase(tmp_path, "B", None, overmind_runtime)
    _check(results, "B")
    assert server_pids(overmind_runtime) == [pid], "the phase-B server must have lived through the phase"
    deadline = time.monotonic() + 5
    while (st := admin.status())["clients"] > 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the workers' connections close as the server sees them end
    cached = _server_usage(pid)
    assert st["bytes"] <= BUDGET and cached["memfd_bytes"] == st["bytes"], (st, cached)
    assert cached["memfds"] == st["entries"], "every memfd the server holds is an entry"
    assert cached["fds"] == start["fds"] + 1 + st["entries"], (start, cached, st)  # +1: admin's connection
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        evictions = f.read().count("least recently used")
    assert evictions > 0, "the budget forced no eviction"
    print(f"soak: {evictions} evictions under the {BUDGET}-byte budget; server {start} -> {cached} -> ", end="")
    admin.evict(all=True)
    admin.close()
    time.sleep(0.3)
    end = _server_usage(pid)
    print(end)
    assert end["memfds"] == 0 and end["memfd_bytes"] == 0, end
    assert end["fds"] == start["fds"], (start, end)
    assert end["rss_kib"] - start["rss_kib"] < 8 * 1024, (start, end)
