"""Admission by reuse in the server, against a real one: a claim on a key no load marked says ``first``; a first load
that nobody asked for meanwhile leaves a mark and gives its claim back; one that another connection waited on
publishes; marks are bounded, listed, counted, dropped by a publish and by ``evict --all``."""
from __future__ import annotations

import fcntl
import os
import threading

from overmind.client.connection import Client
from overmind.server import marks as marks_mod
from overmind.server.store import Store

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


def _sealed(data: bytes) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def test_a_first_load_nobody_waits_on_is_marked_and_its_next_load_publishes(overmind_runtime):
    c = Client()
    first = c.get("k1")
    assert first.status == "claimed" and first.first
    assert c.first_done("k1", 1234, "m.build", "('w.pt',)") is False
    st = c.status()
    assert st["marks"] == 1 and st["marked_bytes"] == 1234 and st["claims"] == 0 and st["publishes"] == 0
    (mark,) = c.ls_all()["marks"]
    assert (mark["key"], mark["nbytes"], mark["loader"], mark["summary"], mark["loads"]) == \
        ("k1", 1234, "m.build", "('w.pt',)", 1)
    other = Client()  # another process's connection: the claim was given back, and the key is no longer first
    second = other.get("k1")
    assert second.status == "claimed" and not second.first
    other.publish("k1", _sealed(b"entry"))
    st = c.status()
    assert st["marks"] == 0 and st["publishes"] == 1 and c.ls_all()["marks"] == []
    assert c.get("k1").status == "hit"


def test_a_first_load_another_connection_waited_on_publishes_and_the_waiter_hits(overmind_runtime):
    holder, waiter = Client(), Client()
    assert holder.get("k2").first
    got = {}
    thread = threading.Thread(target=lambda: got.update(res=waiter.get("k2", timeout=60)))
    thread.start()
    while holder.status()["waiting"] < 1:
        threading.Event().wait(0.01)
    assert holder.first_done("k2", 10) is True  # reused: the claim stays with the holder
    assert holder.status()["marks"] == 0
    holder.publish("k2", _sealed(b"shared"))
    thread.join(60)
    assert got["res"].status == "hit"
    got["res"].close()


def test_a_connection_without_the_claim_cannot_end_a_first_load(overmind_runtime):
    holder, other = Client(), Client()
    holder.get("k3")
    try:
        other.first_done("k3", 1)
    except Exception as e:
        assert "no claim" in str(e), e
    else:
        raise AssertionError("first_done without the claim was accepted")
    assert holder.status()["claims"] == 1 and holder.status()["marks"] == 0


def test_evict_all_drops_the_marks(overmind_runtime):
    c = Client()
    for key in ("a", "b"):
        c.get(key)
        c.first_done(key, 1)
    assert c.status()["marks"] == 2
    c.evict(all=True)
    assert c.status()["marks"] == 0
    assert c.get("a").first


def test_marks_are_bounded_oldest_dropped_first_and_a_marked_key_loaded_again_is_the_newest():
    marks = marks_mod.Marks(limit=3)
    for key in "abc":
        marks.note(key, 1)
    marks.note("a", 2)  # loaded again without a publish: the newest now
    marks.note("d", 1)
    assert [m["key"] for m in marks.listing()] == ["c", "a", "d"]
    assert [m["loads"] for m in marks.listing()] == [1, 2, 1]


def test_a_store_claim_is_first_until_a_mark_and_the_mark_goes_with_a_publish():
    store = Store(1 << 30)
    out = store.get("k", owner=1, claim=True)
    assert out.status == "claimed" and out.entry["first"] is True
    assert store.first_done("k", 1, 5) is False and "k" in store.marks
    out = store.get("k", owner=2, claim=True)
    assert out.status == "claimed" and out.entry["first"] is False
    store.publish("k", 2, _sealed(b"x"), [], {})
    assert "k" not in store.marks
    store.close_all()
