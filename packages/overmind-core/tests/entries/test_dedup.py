"""Identical bytes stored once: an entry whose storages hold bytes another entry already holds
references them there (found by a sampled key, confirmed by a byte compare), and a rebuild is the plain
result all the same: equal values, distinct storages, copy-on-write per object (overmind.entries.dedup)."""
from __future__ import annotations

import os

import pytest
import torch

import overmind
from overmind.client.connection import get_client
from overmind.entries import dedup
from overmind.server.blobs import BlobIndex, held_bytes
from overmind.shm import mappings
from overmind.testing import run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = 256  # a 256x256 float32 weight is 256 KiB: above dedup.MIN_BYTES; its 1 KiB bias is below
LAYER = WIDTH * WIDTH * 4


def _net(seed: int, layers: int = 3) -> torch.nn.Sequential:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(seed)
        return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))


def build_one_way(seed):
    return _net(seed)


def build_other_way(seed):
    """The same weights as build_one_way, by another loader (another key), as AutoModel vs BertModel."""
    return torch.nn.Sequential(*list(_net(seed).children()))


def build_twin(seed):
    """build_one_way's model with its middle layer changed (a LoRA merge of one layer, say)."""
    net = _net(seed)
    with torch.no_grad():
        net[1].weight.mul_(2)
    return net


def build_with_copies(seed):
    """Three distinct storages with equal bytes (and one other), in one result."""
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(seed)
        w = torch.randn(WIDTH, WIDTH)
        return {"a": w, "b": w.clone(), "c": w.clone(), "other": torch.randn(WIDTH, WIDTH)}


def _entry(loader_suffix: str) -> dict:
    [e] = [e for e in get_client().ls() if e["meta"]["loader"].endswith(loader_suffix)]
    return e


def _entry_of(t: torch.Tensor) -> str | None:
    s = t.untyped_storage()
    loc = mappings.locate(s.data_ptr(), s.nbytes())
    return loc.entry_id if loc else None


def _same_values(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


def test_one_model_two_loaders_one_copy(overmind_runtime):
    plain = _net(0)
    first = overmind.load(build_one_way, 0)
    second = overmind.load(build_other_way, 0)
    a, b = _entry("build_one_way"), _entry("build_other_way")
    assert a["entry_id"] != b["entry_id"]
    assert b["deps"] == [a["entry_id"]]
    assert a["nbytes"] >= 3 * LAYER
    # The second entry holds its skeleton and the small biases only: its three weights are a's.
    assert b["nbytes"] < LAYER / 2, b["nbytes"]
    assert len(b["meta"]["dedup"]["redirects"]) == 3
    assert "blobs" not in b["meta"]  # the index keeps the blob list, the entry's meta does not
    assert _same_values(first, plain) and _same_values(second, plain)
    # The second object's weights live in the first entry's bytes, in mappings of their own.
    assert _entry_of(second[0].weight) == a["entry_id"]
    assert second[0].weight.data_ptr() != first[0].weight.data_ptr()
    # Copy-on-write per object: a write to one shows in neither the other nor the cache.
    with torch.no_grad():
        second[0].weight.add_(1)
        first[2].weight.zero_()
    assert torch.equal(first[0].weight, plain[0].weight)
    assert torch.equal(second[2].weight, plain[2].weight)
    again = overmind.load(build_other_way, 0)  # a hit, rebuilt through the redirects
    assert _same_values(again, plain)


FRESH = """
import torch, overmind
from overmind.client.connection import get_client
from overmind.testing import report


def net(seed):
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(seed)
        return torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(3)))


def one_way(seed):
    return net(seed)


def other_way(seed):
    return torch.nn.Sequential(*list(net(seed).children()))


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
"""


def test_hit_in_a_fresh_process_rebuilds_through_the_redirects(overmind_runtime):
    published = run_fresh(FRESH + """
overmind.load(one_way, 0)
overmind.load(other_way, 0)
report({e["meta"]["loader"]: [e["entry_id"], e["deps"]] for e in get_client().ls()})
""")
    [(a_id, a_deps)] = [v for k, v in published.items() if k.endswith("one_way")]
    [(_, b_deps)] = [v for k, v in published.items() if k.endswith("other_way")]
    assert b_deps == [a_id] and a_deps == []
    out = run_fresh(FRESH + """
two = overmind.load(other_way, 0)
one = overmind.load(one_way, 0)
with torch.no_grad():
    two[1].weight.add_(1)
report({"two": not same(two, net(0)) and torch.equal(two[0].weight, net(0)[0].weight),
        "one": same(one, net(0)), "hits": get_client().status()["hits"]})
""")
    assert out == {"two": True, "one": True, "hits": 2}


def test_partial_sharing_all_but_the_changed_layer(overmind_runtime):
    overmind.load(build_one_way, 0)
    twin = overmind.load(build_twin, 0)
    a, t = _entry("build_one_way"), _entry("build_twin")
    assert t["deps"] == [a["entry_id"]]
    rows = t["meta"]["dedup"]["redirects"]
    assert len(rows) == 2  # layers 0 and 2
    assert LAYER <= t["nbytes"] < LAYER + LAYER / 2  # it holds the changed layer only
    expected = build_twin(0)
    assert _same_values(twin, expected)
    assert _entry_of(twin[0].weight) == a["entry_id"] and _entry_of(twin[1].weight) == t["entry_id"]


def test_equal_storages_of_one_entry_stored_once_and_rebuilt_distinct(overmind_runtime):
    got = overmind.load(build_with_copies, 0)
    e = _entry("build_with_copies")
    assert e["deps"] == []
    assert len(e["meta"]["dedup"]["redirects"]) == 2  # b and c share a's bytes
    assert 2 * LAYER <= e["nbytes"] < 2 * LAYER + LAYER / 2
    plain = build_with_copies(0)
    assert all(torch.equal(got[k], plain[k]) for k in plain)
    ptrs = {got[k].untyped_storage().data_ptr() for k in ("a", "b", "c")}
    assert len(ptrs) == 3  # three storages, as in the plain result
    got["b"].add_(1)
    assert torch.equal(got["a"], plain["a"]) and torch.equal(got["c"], plain["c"])
    assert torch.equal(got["b"], plain["b"] + 1)


def test_a_colliding_key_never_makes_a_wrong_hit(overmind_runtime, monkeypatch):
    # Every storage of a size gets one key: the index offers the first model's bytes for the second's, and only
    # the compare can tell them apart.
    monkeypatch.setattr(dedup, "blob_key", lambda address, nbytes: f"{nbytes}:{'0' * 32}")
    overmind.load(build_one_way, 0)
    other = overmind.load(build_one_way, 1)
    plans = []
    real = dedup.plan
    monkeypatch.setattr(dedup, "plan", lambda storages, lookup=None: plans.append(real(storages, lookup))
                        or plans[-1])
    third = overmind.load(build_one_way, 2)
    first_seed0, seed1, seed2 = [e for e in get_client().ls() if e["meta"]["loader"].endswith("build_one_way")]
    for e in (seed1, seed2):
        assert e["deps"] == [] and e["nbytes"] >= 3 * LAYER and "dedup" not in e["meta"]
    assert _same_values(other, _net(1)) and _same_values(third, _net(2))
    assert plans[0].compared > 0 and plans[0].saved == 0  # candidates were offered and refused by the compare
    assert _same_values(overmind.load(build_one_way, 1), _net(1))


def test_evicting_the_holder_while_referenced(overmind_runtime):
    overmind.load(build_one_way, 0)
    overmind.load(build_other_way, 0)
    client = get_client()
    a, b = _entry("build_one_way"), _entry("build_other_way")
    assert client.status()["blobs"] == 3
    refused = client.evict(a["key"])
    assert refused["evicted"] == [] and b["entry_id"] in refused["refused"][0]["reason"]
    # Taken out of service (marked bad): no longer served, kept while b references it.
    assert client.mark_bad(a["key"], a["entry_id"])
    assert _same_values(overmind.load(build_other_way, 0), _net(0))  # b still hits and rebuilds
    assert client.status()["hits"] >= 1
    # The first loader loads again: its bytes are found in the entry b keeps alive.
    reloaded = overmind.load(build_one_way, 0)
    assert _same_values(reloaded, _net(0))
    [a2] = [e for e in client.ls() if e["meta"]["loader"].endswith("build_one_way") and e["entry_id"] != a["entry_id"]]
    assert a2["entry_id"] != a["entry_id"] and a2["deps"] == [a["entry_id"]]
    assert client.evict(b["key"])["evicted"] == [b["key"]]
    assert client.evict(a2["key"])["evicted"] == [a2["key"]]  # the bad one goes with its last referent
    st = client.status()
    assert st["entries"] == 0 and st["blobs"] == 0 and st["bytes"] == 0


def test_evict_all_empties_the_index(overmind_runtime):
    overmind.load(build_one_way, 0)
    overmind.load(build_twin, 0)
    client = get_client()
    assert client.status()["blobs"] == 4  # three weights, and the twin's changed one
    client.evict(all=True)
    assert client.status()["blobs"] == 0


def test_holder_gone_between_lookup_and_publish(overmind_runtime, monkeypatch):
    """The candidate is evicted after the compare: the publish is refused ('dep missing') and the entry is
    written whole instead."""
    overmind.load(build_one_way, 0)
    holder = _entry("build_one_way")
    real = dedup._server_lookup

    def lookup_then_evict(keys):
        found = real(keys)
        get_client().evict(holder["key"])
        return found

    monkeypatch.setattr(dedup, "_server_lookup", lookup_then_evict)
    got = overmind.load(build_other_way, 0)
    assert _same_values(got, _net(0))
    [b] = get_client().ls()
    assert b["meta"]["loader"].endswith("build_other_way") and b["deps"] == [] and b["nbytes"] >= 3 * LAYER


def test_setting_off_writes_every_storage(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_DEDUP", "0")
    overmind.load(build_one_way, 0)
    got = overmind.load(build_other_way, 0)
    b = _entry("build_other_way")
    assert b["deps"] == [] and b["nbytes"] >= 3 * LAYER and "dedup" not in b["meta"]
    assert get_client().status()["blobs"] == 0
    assert _same_values(got, _net(0))


def test_lookup_failure_writes_every_storage(overmind_runtime, monkeypatch):
    overmind.load(build_one_way, 0)

    def broken(keys):
        raise OSError("no server")

    monkeypatch.setattr(dedup, "_server_lookup", broken)
    got = overmind.load(build_other_way, 0)
    assert _entry("build_other_way")["deps"] == [] and _same_values(got, _net(0))


def test_blob_key_samples_size_and_spread_bytes():
    a = torch.zeros(1 << 20, dtype=torch.uint8)
    key = dedup.blob_key(a.data_ptr(), a.numel())
    assert key.startswith(f"{1 << 20}:")
    b = a.clone()
    b[-1] = 1  # the last chunk is sampled
    assert dedup.blob_key(b.data_ptr(), b.numel()) != key
    c = a.clone()
    c[dedup.CHUNK + 7] = 1  # between samples: same key, which is why the compare decides
    assert dedup.blob_key(c.data_ptr(), c.numel()) == key
    assert dedup.blob_key(a.data_ptr(), a.numel() - 64) != key  # the size is part of the key
    assert not dedup.same_bytes(a.data_ptr(), c.data_ptr(), a.numel())


def test_blob_index_add_find_remove():
    index = BlobIndex()
    index.add("e1", [("10:ab", 0), ("20:cd", 64)])
    index.add("e2", [("10:ab", 128)])
    assert index.find(["20:cd", "10:ab", "30:ef"]) == [(0, "e1", 64), (1, "e1", 0), (1, "e2", 128)]
    index.remove("e1")
    assert index.find(["20:cd", "10:ab"]) == [(1, "e2", 128)]
    index.remove("e2")
    assert len(index) == 0 and index.entries() == 0


def test_held_bytes_counts_pages_not_holes():
    fd = os.memfd_create("overmind-test-holes")
    try:
        os.ftruncate(fd, 64 << 20)
        os.pwrite(fd, b"x" * 4096, 8192)
        assert held_bytes(fd, 64 << 20) < 64 << 10
    finally:
        os.close(fd)


def test_server_refuses_malformed_blob_requests(overmind_runtime):
    from overmind.errors import ServerError

    client = get_client()
    with pytest.raises(ServerError) as info:
        client._request({"op": "blobs", "keys": ["not a key"]})
    assert info.value.reason == "bad request"
    assert client.blobs(["123:" + "0" * 32]) == ([], {})


def test_only_the_largest_storages_are_keyed_past_the_cap(overmind_runtime, monkeypatch):
    """The blob list and redirect table ride in a request of at most 1 MiB: past MAX_KEYED storages, the largest
    are keyed and the rest written."""
    monkeypatch.setattr(dedup, "MAX_KEYED", 2)
    overmind.load(build_one_way, 0)
    assert get_client().status()["blobs"] == 2
    got = overmind.load(build_other_way, 0)
    b = _entry("build_other_way")
    assert len(b["meta"]["dedup"]["redirects"]) == 2 and LAYER <= b["nbytes"] < LAYER + LAYER / 2
    assert _same_values(got, _net(0))
