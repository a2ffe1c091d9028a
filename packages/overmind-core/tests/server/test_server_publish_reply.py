"""``publish`` answers like a ``get`` hit: the publisher gets the entry and its fds back, so a
miss is one round trip, and the reply is not counted as a hit."""
from __future__ import annotations

import os

from overmind.client.connection import Client


def test_publish_replies_with_the_entry_and_the_fds_of_its_dependencies(overmind_runtime, sealed_memfd):
    c = Client()
    base = c.publish("base", sealed_memfd(b"base"))
    res = c.publish_hit("top", sealed_memfd(b"top"), deps=[base], meta={"loader": "L"})
    try:
        assert res.status == "hit" and res.entry["key"] == "top" and res.entry["meta"] == {"loader": "L"}
        assert list(res.fds) == [res.entry["entry_id"], base]
        assert os.pread(res.fds[res.entry["entry_id"]], 3, 0) == b"top"
        assert os.pread(res.fds[base], 4, 0) == b"base"
    finally:
        res.close()
    assert {r["key"]: r["hits"] for r in c.ls()} == {"base": 0, "top": 0}


def test_a_second_publish_of_a_key_replies_with_the_entry_already_serving_it(overmind_runtime, sealed_memfd):
    c = Client()
    first = c.publish_hit("k", sealed_memfd(b"first"))
    second = c.publish_hit("k", sealed_memfd(b"second"))
    try:
        assert second.entry["entry_id"] == first.entry["entry_id"]
        assert os.pread(second.fds[second.entry["entry_id"]], 5, 0) == b"first"
    finally:
        first.close()
        second.close()
