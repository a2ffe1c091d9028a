"""Entry ids are unique across server lifetimes: an object mapped from a server that died is
never taken for an entry of the server that replaced it."""
from __future__ import annotations

import os
import signal

import pytest
import torch

import overmind
from overmind.client.connection import Client
from overmind.client.launcher import server_lock_free, server_pids
from overmind.errors import ServerError
from overmind.testing import run_fresh


def _kill_server(runtime_dir: str) -> None:
    for pid in server_pids(runtime_dir):
        os.kill(pid, signal.SIGKILL)
    while not server_lock_free(runtime_dir):
        os.sched_yield()


def test_the_same_key_published_in_two_servers_gets_two_ids(overmind_runtime, sealed_memfd):
    c = Client()
    old = c.publish("same-key", sealed_memfd(b"from A"))
    _kill_server(overmind_runtime)
    new = c.publish("same-key", sealed_memfd(b"from B"))
    assert new != old
    with pytest.raises(ServerError, match="not cached"):
        c.fds([old])
    with pytest.raises(ServerError) as info:
        c.publish("referrer", sealed_memfd(b"x"), deps=[old])
    assert info.value.reason == "dep missing"


LOADERS = """
import torch

def noise():
    # Stands for any loader whose bytes differ between two publishes of one key (a re-saved checkpoint).
    return torch.randn(256)

def keep(x):
    return {"x": x}
"""


def test_an_object_from_a_dead_server_is_not_taken_for_the_new_servers_entry(overmind_runtime, tmp_path,
                                                                              monkeypatch):
    (tmp_path / "om_id_loaders.py").write_text(LOADERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import om_id_loaders as loaders

    held = overmind.load(loaders.noise)  # mapped from server A's entry
    mine = held.clone()
    _kill_server(overmind_runtime)
    # Another process publishes the same key in server B first: old servers gave it the same entry id.
    run_fresh(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import overmind, om_id_loaders
        from overmind.testing import report
        overmind.load(om_id_loaders.noise)
        report(True)
    """)
    out = overmind.load(loaders.keep, held)
    assert torch.equal(out["x"], mine), "the result holds server B's bytes instead of the caller's tensor"
