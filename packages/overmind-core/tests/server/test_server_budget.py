"""Budget and eviction against a real server: LRU order, live mappings survive, references protect."""
from __future__ import annotations

import mmap

import pytest

from overmind.client.connection import Client
from overmind.errors import ServerError

K = 1024


@pytest.fixture
def client(overmind_runtime, monkeypatch):
    """A client whose freshly started server has a 40 KiB budget (room for two 16 KiB entries)."""
    monkeypatch.setenv("OVERMIND_MAX_BYTES", "40K")
    c = Client()
    assert c.status()["max_bytes"] == 40 * K
    return c


def _keys(c: Client) -> set[str]:
    return {row["key"] for row in c.ls()}


def test_lru_entry_is_evicted_and_a_live_mapping_of_it_still_reads_right(client, sealed_memfd):
    client.publish("a", sealed_memfd(b"A" * 16 * K))
    client.publish("b", sealed_memfd(b"B" * 16 * K))
    hit = client.get("a")
    mapping = mmap.mmap(hit.fds[hit.entry["entry_id"]], 0, access=mmap.ACCESS_COPY)
    hit.close()  # only the mapping keeps "a" alive in this process now
    client.get("b").close()  # "b" is now more recently used than "a"

    client.publish("c", sealed_memfd(b"C" * 16 * K))

    assert _keys(client) == {"b", "c"}
    assert client.get("a", claim=False).status == "miss"
    assert mapping[:] == b"A" * 16 * K
    mapping.close()
    assert client.status()["bytes"] == 32 * K


def test_eviction_frees_as_many_entries_as_needed(client, sealed_memfd):
    for name in "abcd":
        client.publish(name, sealed_memfd(name.encode() * 8 * K))
    assert _keys(client) == {"a", "b", "c", "d"}
    client.publish("big", sealed_memfd(b"x" * 30 * K))
    assert _keys(client) == {"d", "big"}


def test_referenced_entry_is_not_evicted_even_when_least_recently_used(client, sealed_memfd):
    base = client.publish("base", sealed_memfd(b"0" * 16 * K))
    client.publish("user", sealed_memfd(b"1" * 16 * K), deps=[base])
    client.get("user").close()  # "base" is the least recently used entry, but "user" references it
    client.publish("new", sealed_memfd(b"2" * 16 * K))
    assert _keys(client) == {"base", "new"}, "the unreferenced entry goes; the referenced one stays"


def test_new_entrys_own_deps_are_never_evicted_to_make_room_for_it(client, sealed_memfd):
    base = client.publish("base", sealed_memfd(b"0" * 16 * K))
    client.publish("other", sealed_memfd(b"1" * 16 * K))
    client.get("other").close()
    client.publish("child", sealed_memfd(b"2" * 16 * K), deps=[base])
    assert _keys(client) == {"base", "child"}


def test_entry_that_cannot_fit_is_refused_with_budget_and_nothing_is_evicted(client, sealed_memfd):
    base = client.publish("base", sealed_memfd(b"0" * 16 * K))
    client.publish("user", sealed_memfd(b"1" * 16 * K), deps=[base])
    with pytest.raises(ServerError, match="OVERMIND_MAX_BYTES") as info:
        client.publish("huge", sealed_memfd(b"2" * 41 * K))
    assert info.value.reason == "budget"
    with pytest.raises(ServerError) as info:
        # Only "user" is evictable (16 KiB); that is not enough for 25 KiB, so nothing may be evicted.
        client.publish("mid", sealed_memfd(b"3" * 25 * K), deps=[base])
    assert info.value.reason == "budget"
    assert _keys(client) == {"base", "user"}


def test_evict_refuses_a_referenced_entry_unless_all(client, sealed_memfd):
    base = client.publish("base", sealed_memfd(b"0" * K))
    client.publish("user", sealed_memfd(b"1" * K), deps=[base])
    out = client.evict("base")
    assert out["evicted"] == [] and out["refused"][0]["key"] == "base"
    assert "referenced by" in out["refused"][0]["reason"]
    assert client.evict("nope")["refused"] == [{"key": "nope", "reason": "not cached"}]
    assert client.evict("user") == {"evicted": ["user"], "refused": []}
    assert client.evict("base") == {"evicted": ["base"], "refused": []}
    client.publish("x", sealed_memfd(b"x"))
    client.publish("y", sealed_memfd(b"y"), deps=[client.ls()[0]["entry_id"]])
    assert sorted(client.evict(all=True)["evicted"]) == ["x", "y"]
    assert client.status()["bytes"] == 0 and client.ls() == []


def test_admission_answers_before_a_publish_and_remembers_an_entry_larger_than_the_budget(client, sealed_memfd):
    assert client.get("huge").status == "claimed"
    verdict = client.admit("huge", 41 * K)
    assert (verdict["admitted"], verdict["why"], verdict["need"], verdict["budget"]) == (False, "budget", 41 * K, 40 * K)
    assert "its entry needs 41.0 KiB and the whole budget is 40.0 KiB" in verdict["message"]
    assert "set OVERMIND_MAX_BYTES above 41.0 KiB and restart the server ('overmind stop')" in verdict["message"]
    client.release("huge")
    refused = client.get("huge")  # every later get of that key: plain, no claim
    assert refused.status == "refused" and refused.refusal["need"] == 41 * K and refused.entry is None
    assert client.status()["refused_keys"] == 1
    assert client.admit("fits", 39 * K) == {"admitted": True}
    assert client.get("fits").status == "claimed"  # a key that fits is claimed as ever


def test_an_entry_its_own_dependencies_leave_no_room_for_is_refused_for_now_in_human_units(client, sealed_memfd):
    base = client.publish("base", sealed_memfd(b"0" * 16 * K))
    client.publish("user", sealed_memfd(b"1" * 16 * K), deps=[base])
    with pytest.raises(ServerError) as info:  # its own dependency "base" stays: 24 KiB can be freed, not 25
        client.publish("mid", sealed_memfd(b"3" * 25 * K), deps=[base])
    assert info.value.reason == "budget"
    assert "needs 25.0 KiB and only 24.0 KiB of the 40.0 KiB budget can be freed now" in str(info.value)
    assert client.get("mid").status == "claimed", "not remembered: a later load may find the room"
    assert client.admit("mid2", 30 * K) == {"admitted": True}, "without dependencies both entries may go"
    assert _keys(client) == {"base", "user"}, "asking evicts nothing"


def test_a_claim_reports_the_room_an_entry_may_take(client, sealed_memfd):
    claimed = client.get("a")
    assert (claimed.room, claimed.entry) == (40 * K, None)
    base = client.publish("base", sealed_memfd(b"0" * 16 * K))
    client.publish("user", sealed_memfd(b"1" * 16 * K), deps=[base])
    assert client.get("b").room == 24 * K
