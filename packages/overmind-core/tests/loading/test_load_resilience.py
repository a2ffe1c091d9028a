"""The user's load never breaks: server killed between and during loads, a loader killed mid-publish,
results that cannot be pickled, a budget too small, a server that cannot start, and the off switches."""
from __future__ import annotations

import os
import signal
import warnings

import pytest
import torch

import overmind
from overmind.client import connection as client_mod
from overmind.entries import pickling
from overmind.fallback import CacheBypassed, OvermindWarning
from overmind.loading import flow
from overmind.testing import clear_calls, overmind_mapped, record_call, recorded_calls, run_fresh, server_pids

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin



def build(n: int = 32) -> torch.nn.Module:
    record_call(n)
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(n)
        return torch.nn.Linear(n, n)


class Unpicklable:
    def __init__(self):
        self.pending = (i for i in range(3))  # neither pickle nor dill can pickle a running generator
        self.weight = torch.ones(4)


def unpicklable():
    return Unpicklable()


def _plain_equal(a: torch.nn.Module, n: int) -> bool:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(n)
        b = torch.nn.Linear(n, n)
        return torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def _quiet_load(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = overmind.load(fn, *args, **kwargs)
    return result, [w for w in caught if issubclass(w.category, OvermindWarning)]


def _kill_server(runtime_dir: str) -> None:
    for pid in server_pids(runtime_dir):
        os.kill(pid, signal.SIGKILL)


def test_server_killed_between_loads(overmind_runtime):
    clear_calls()
    a, w = _quiet_load(build, 16)
    assert not w and overmind_mapped(a.weight.data_ptr())
    _kill_server(overmind_runtime)
    b, w = _quiet_load(build, 16)  # the client respawns the server; the entry is gone, so it loads again
    assert _plain_equal(b, 16) and overmind_mapped(b.weight.data_ptr())
    assert recorded_calls() == [16, 16]
    c, w = _quiet_load(build, 16)
    assert not w and recorded_calls() == [16, 16] and _plain_equal(c, 16)


def killing_loader(runtime_dir: str, n: int):
    for pid in server_pids(runtime_dir):
        os.kill(pid, signal.SIGKILL)
    return build(n)


def test_server_killed_during_a_load(overmind_runtime):
    clear_calls()
    m, w = _quiet_load(killing_loader, overmind_runtime, 24)
    assert _plain_equal(m, 24)
    assert len(w) <= 1
    # the next load is served normally, by a fresh server
    m2, w2 = _quiet_load(build, 24)
    assert _plain_equal(m2, 24) and not w2


def test_loader_killed_mid_publish_leaves_nothing_half_written(overmind_runtime):
    victim = '''
import os, signal, torch, overmind
import overmind.shm.writer as writer
real = writer.write_entry
def dying_write(*args, **kwargs):
    fd = real(*args, **kwargs)          # the memfd is written and sealed, but never published
    os.kill(os.getpid(), signal.SIGKILL)
writer.write_entry = dying_write
def build():  # no draw from the global generator: a loader that draws is not cached
    m = torch.nn.utils.skip_init(torch.nn.Linear, 8, 8)
    torch.nn.init.zeros_(m.weight)
    torch.nn.init.zeros_(m.bias)
    return m
overmind.load(build)
'''
    out = run_fresh(victim, check=False)
    assert out["returncode"] == -signal.SIGKILL
    survivor = '''
import torch, overmind
from overmind.testing import report
def build():  # no draw from the global generator: a loader that draws is not cached
    m = torch.nn.utils.skip_init(torch.nn.Linear, 8, 8)
    torch.nn.init.zeros_(m.weight)
    torch.nn.init.zeros_(m.bias)
    return m
m = overmind.load(build)
c = overmind.client.connection.get_client()
report({"entries": len(c.ls()), "shape": list(m.weight.shape)})
'''
    res = run_fresh(survivor, env={"OVERMIND_STRICT": "1"})
    assert res == {"entries": 1, "shape": [8, 8]}


def test_unpicklable_result_returns_plain_object_with_one_warning(overmind_runtime):
    obj, w = _quiet_load(unpicklable)
    assert isinstance(obj, Unpicklable) and torch.equal(obj.weight, torch.ones(4))
    assert len(w) == 1 and "could not cache" in str(w[0].message) and "Unpicklable" in str(w[0].message)
    assert client_mod.get_client().ls() == []  # nothing published, claim released


def test_strict_mode_raises_instead(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    with pytest.raises(CacheBypassed, match="could not cache"):
        overmind.load(unpicklable)


def test_disable_switch_makes_load_a_plain_call(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_DISABLE", "1")
    clear_calls()
    m, w = _quiet_load(build, 8)
    assert not w and recorded_calls() == [8] and not overmind_mapped(m.weight.data_ptr())
    assert not os.path.exists(os.path.join(overmind_runtime, "server.sock"))


def test_budget_too_small_returns_plain_result(monkeypatch):
    from overmind.testing import isolated_runtime

    with isolated_runtime():
        monkeypatch.setenv("OVERMIND_MAX_BYTES", "4K")
        m, w = _quiet_load(build, 128)
        assert _plain_equal(m, 128)
        assert len(w) == 1 and "OVERMIND_MAX_BYTES" in str(w[0].message)


def test_server_that_cannot_start_falls_back(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", str(not_a_dir / "sub"))
    clear_calls()
    m, w = _quiet_load(build, 12)
    assert _plain_equal(m, 12) and recorded_calls() == [12]
    assert len(w) == 1 and "overmind doctor" in str(w[0].message)


def test_unkeyable_arguments_load_directly_without_warning(overmind_runtime):
    clear_calls()

    def build_with(module):
        record_call(1)
        return module

    plain_module = torch.nn.Linear(2, 2)  # not from an Overmind load: no stable key
    m, w = _quiet_load(build_with, plain_module)
    assert m is plain_module and not w and recorded_calls() == [1]


def test_loader_exceptions_propagate_and_release_the_claim(overmind_runtime):
    def failing():
        raise ValueError("bad checkpoint")

    with pytest.raises(ValueError, match="bad checkpoint"):
        overmind.load(failing)
    res = client_mod.get_client().get(flow.key.make_key(flow.key.describe_loader(failing), {}).key,
                                      claim=True, wait=False)
    assert res.status == "claimed"  # nobody holds it any more


class NotCacheableHere(Exception):
    has_fix = True  # the message already says what to do


def unpicklable_part():
    return Unpicklable()


def unpicklable_whole():
    return {"part": overmind.load(unpicklable_part)}


def test_a_nested_failure_warns_once_for_one_user_call(overmind_runtime):
    whole, w = _quiet_load(unpicklable_whole)
    assert isinstance(whole["part"], Unpicklable)
    assert len(w) == 1 and "unpicklable_part" in str(w[0].message)


def test_an_exception_that_names_its_fix_gets_no_generic_advice(overmind_runtime, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise NotCacheableHere("load onto one device to cache it")

    monkeypatch.setattr(pickling, "dumps", refuse)
    m, w = _quiet_load(build, 10)
    assert _plain_equal(m, 10)
    assert len(w) == 1 and str(w[0].message).endswith("load onto one device to cache it); returned the plain result.")


def test_an_inconsistent_entry_gives_the_plain_result(overmind_runtime, sealed_memfd):
    """A payload that does not rebuild (foreign bytes under the right key) is bypassed with one warning."""
    ck = flow.key.make_key(flow.key.describe_loader(build), {"n": 20})
    client = client_mod.get_client()
    assert client.get(ck.key, claim=True, wait=False).status == "claimed"
    client.publish(ck.key, sealed_memfd(b"not an overmind entry" * 300), deps=[], meta={"loader": "x"})
    clear_calls()
    m, w = _quiet_load(build, 20)
    assert _plain_equal(m, 20) and recorded_calls() == [20]
    # the entry is out of service already, so the warning proposes no 'overmind evict' (it answered
    # "not cached"); test_user_warnings runs the commands warnings propose.
    assert len(w) == 1 and "cannot rebuild entry" in str(w[0].message) and "overmind doctor" in str(w[0].message)
    assert "overmind evict" not in str(w[0].message)


class InterruptsPickling:
    """A result whose pickling is interrupted (Ctrl-C arriving while the cold load publishes)."""

    def __reduce__(self):
        if os.environ.get("OM_TEST_INTERRUPT_PICKLING") == "1":
            raise KeyboardInterrupt
        return (InterruptsPickling, ())


def interrupted_publish(n: int):
    return {"n": n, "trap": InterruptsPickling()} if n else {"n": n}


def test_ctrl_c_while_publishing_gives_the_claim_back(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OM_TEST_INTERRUPT_PICKLING", "1")
    with pytest.raises(KeyboardInterrupt):
        overmind.load(interrupted_publish, 1)
    monkeypatch.delenv("OM_TEST_INTERRUPT_PICKLING")
    # The claim must be free now, not held until this process's connection closes: another process gets it.
    got = run_fresh(f"""
import sys, warnings
sys.path.insert(0, {os.path.dirname(__file__)!r})
import overmind
from overmind.fallback import OvermindWarning
from overmind.testing import report
from test_load_resilience import interrupted_publish
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    overmind.load(interrupted_publish, 1)
report([str(x.message) for x in w if issubclass(x.category, OvermindWarning)])
""", env={"OVERMIND_WAIT_TIMEOUT": "3"})
    assert got == [], got


class Payload:
    def __init__(self, i: int):
        self.i = i
        self.blob = bytearray(256 << 10)  # what a real closure would hold on to: 256 KiB each


def test_loaders_and_what_they_capture_are_not_kept_alive(overmind_runtime):
    """A cache of signatures (or keys) holding loaders would keep every closure alive (500 lambdas: +169 MB).
    After the loads, nothing in Overmind may hold a loader or what it captured."""
    import gc
    import weakref

    refs = []
    for i in range(200):
        payload = Payload(i)
        loader = (lambda p: lambda: torch.tensor([p.i]))(payload)
        assert overmind.load(loader).item() == i
        refs.append((weakref.ref(payload), weakref.ref(loader)))
        del payload, loader
    gc.collect()
    alive = [i for i, (p, f) in enumerate(refs) if p() is not None or f() is not None]
    assert not alive, f"{len(alive)} of 200 loaders (or their captured payloads) are still alive"
