"""A corrupt entry is not served forever: the ``bad`` op takes it out of service at once, so
the next load claims and republishes; its memory goes once no other entry references it, and mappings
clients already hold keep reading right."""
from __future__ import annotations

import mmap
import os
import warnings

import torch

import overmind
from overmind.client import connection as client_mod
from overmind.client.connection import Client
from overmind.fallback import OvermindWarning
from overmind.loading import flow
from overmind.testing import overmind_mapped


def build(n: int) -> torch.nn.Module:
    torch.manual_seed(n)
    return torch.nn.Linear(n, n)


def _read(fd: int) -> bytes:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) as m:
        return m[:]


def test_a_bad_entry_is_no_longer_served_and_the_key_is_claimed_again(overmind_runtime, sealed_memfd):
    c = Client()
    bad = c.publish("k", sealed_memfd(b"corrupt"))
    held = c.get("k", claim=False)
    assert c.mark_bad("k", bad) is True
    assert c.get("k").status == "claimed", "the next get must let the loader republish"
    good = c.publish("k", sealed_memfd(b"good"))
    assert good != bad
    hit = c.get("k", claim=False)
    assert hit.entry["entry_id"] == good and _read(hit.fds[good]) == b"good"
    assert _read(held.fds[bad]) == b"corrupt", "a mapping a client already holds stays valid"
    hit.close()
    held.close()
    st = c.status()
    assert st["entries"] == 1 and st["bytes"] == len(b"good"), "the bad entry's memory is freed"
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert f"marked {bad} bad" in f.read()


def test_a_stale_report_does_not_touch_the_current_entry(overmind_runtime, sealed_memfd):
    c = Client()
    first = c.publish("k", sealed_memfd(b"one"))
    assert c.mark_bad("k", first) is True
    second = c.publish("k", sealed_memfd(b"two"))
    assert c.mark_bad("k", first) is False, "the report names an entry that is already out of service"
    assert c.mark_bad("other", second) is False, "the id must belong to the key"
    assert c.get("k", claim=False).entry["entry_id"] == second


def test_a_bad_entry_referenced_by_another_stays_until_that_one_goes(overmind_runtime, sealed_memfd):
    c = Client()
    base = c.publish("base", sealed_memfd(b"base"))
    top = c.publish("top", sealed_memfd(b"top"), deps=[base])
    assert c.mark_bad("base", base) is True
    assert c.get("base", claim=False).status == "miss"
    hit = c.get("top", claim=False)  # the referent still rebuilds from the bad entry's bytes
    assert list(hit.fds) == [top, base] and _read(hit.fds[base]) == b"base"
    hit.close()
    assert c.status()["entries"] == 2
    assert c.evict("top")["evicted"] == ["top"]
    assert c.status() | {} and c.status()["entries"] == 0 and c.status()["bytes"] == 0


def test_after_a_failed_rebuild_the_next_load_is_cached_again(overmind_runtime, sealed_memfd):
    ck = flow.key.make_key(flow.key.describe_loader(build), {"n": 20})
    client = client_mod.get_client()
    assert client.get(ck.key, claim=True, wait=False).status == "claimed"
    bad = client.publish(ck.key, sealed_memfd(b"not an overmind entry" * 300), deps=[], meta={"loader": "x"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = overmind.load(build, 20)
        second = overmind.load(build, 20)
        third = overmind.load(build, 20)
    ours = [w for w in caught if issubclass(w.category, OvermindWarning)]
    assert len(ours) == 1 and "cannot rebuild entry" in str(ours[0].message), [str(w.message) for w in ours]
    for m in (first, second, third):
        torch.manual_seed(20)
        plain = torch.nn.Linear(20, 20)
        assert torch.equal(m.weight, plain.weight) and torch.equal(m.bias, plain.bias)
    assert overmind_mapped(second.weight.data_ptr()) and overmind_mapped(third.weight.data_ptr())
    (row,) = client.ls()
    assert row["entry_id"] != bad and row["key"] == ck.key
    with open(os.path.join(overmind_runtime, "server.log")) as f:
        assert f.read().count(" published ") == 2, "the loader republished once, then the entry was served"
