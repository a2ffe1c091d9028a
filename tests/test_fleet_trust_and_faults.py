"""What a node of a fleet refuses and what it survives, in fresh processes of two nodes on one machine
(each its own server and its own copy of a tiny BERT): an entry in the store that is unsigned, changed
after it was signed, signed with another key, for another stack, or whose blob is damaged or cut short is
refused with one warning, and the load equals the plain load; a store that is down or stalled costs one
warning and at most the fleet timeout; eviction on a node leaves the store alone; two nodes uploading one
entry at once are fine; and an entry exported as an OCI layout on one node is imported by another.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from _support.fleet_nodes import Node, copy_model, write_fleet_key
from _support.seaweed import closed_endpoint
from _support.tiny_models import build_bert

pytest.importorskip("transformers")

# Runs in a fresh process of a node: the load, what it returned, and Overmind's warnings.
LOAD_BERT = """
import time, warnings
start = time.perf_counter()
import overmind
overmind.activate()
import torch
from transformers import AutoModel, AutoTokenizer
from overmind.testing import report
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    begun = time.perf_counter()
    model = AutoModel.from_pretrained({path!r})
    tok = AutoTokenizer.from_pretrained({path!r})
    load_s = time.perf_counter() - begun
ids = torch.tensor([tok("the cat sat").input_ids])
with torch.no_grad():
    out = model(ids).last_hidden_state
report({{"out": out.flatten().tolist(), "config": model.config.to_dict(), "tok": [tok.name_or_path,
        sorted((k, str(v)) for k, v in tok.init_kwargs.items())], "types": [type(model).__name__,
        type(tok).__name__], "load_s": load_s,
        "warnings": [str(w.message) for w in caught if type(w.message).__name__ == "OvermindWarning"]}})
"""
SAME = ("out", "config", "tok", "types")


def _same(got: dict, plain: dict) -> bool:
    return all(got[k] == plain[k] for k in SAME)


@pytest.fixture
def model(tmp_path):
    return build_bert(tmp_path / "built")


@pytest.fixture
def nodes(tmp_path):
    """Nodes a and b sharing the folder store ``tmp_path/store``, each with its own model copy."""
    a, b = Node.pair(tmp_path, "file://" + str(tmp_path / "store"))
    yield a, b
    a.stop()
    b.stop()


def _run(node: Node, path, env: dict | None = None) -> dict:
    return node.run(LOAD_BERT.format(path=str(path)), env=env)


def _plain(node: Node, path) -> dict:
    return node.run_plain(LOAD_BERT.format(path=str(path)))


def _published_by_a(tmp_path, a: Node, model) -> int:
    """Node a loads (and uploads); how many entries it uploaded."""
    _run(a, copy_model(model, tmp_path / "a" / "bert"))
    return a.wait_uploads(2)["fleet_uploads"]  # the model and the tokenizer


def _tamper_signature(tmp_path) -> None:
    for name in os.listdir(tmp_path / "store" / "refs"):
        path = tmp_path / "store" / "refs" / name
        data = json.loads(path.read_bytes())
        data["meta"]["summary_note"] = "x"  # a field the signature covers, changed after signing
        path.write_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def _unsign(tmp_path) -> None:
    for name in os.listdir(tmp_path / "store" / "refs"):
        path = tmp_path / "store" / "refs" / name
        data = json.loads(path.read_bytes())
        data.pop("signature")
        path.write_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def _damage_blob(tmp_path, cut: bool) -> None:
    digests = {json.loads((tmp_path / "store" / "refs" / name).read_bytes())["main"]["digest"]
               for name in os.listdir(tmp_path / "store" / "refs")}
    for digest in digests:  # each once: two entries may share a blob
        blob = tmp_path / "store" / "blobs" / "sha256" / digest
        data = bytearray(blob.read_bytes())
        if cut:
            data = data[: len(data) // 2]
        else:
            data[len(data) // 2] ^= 0xFF
        os.chmod(blob, 0o644)
        blob.write_bytes(bytes(data))


def _foreign_stack(tmp_path, key_file: str) -> None:
    from overmind.fleet import manifest as fleet_manifest

    key = open(key_file, "rb").read().strip()
    for name in os.listdir(tmp_path / "store" / "refs"):
        path = tmp_path / "store" / "refs" / name
        body = json.loads(path.read_bytes())
        body.pop("signature")
        body["stack"]["torch"] = "0.0.1"  # signed with the fleet key, for another stack
        path.write_bytes(fleet_manifest.sign(body, key))


REASONS = {"unsigned": "not signed", "changed after signing": "bad signature", "blob damaged": "other bytes",
           "blob cut short": "bytes, not", "another stack": "another software stack"}
TAMPERS = {
    "unsigned": lambda tmp_path, key_file: _unsign(tmp_path),
    "changed after signing": lambda tmp_path, key_file: _tamper_signature(tmp_path),
    "blob damaged": lambda tmp_path, key_file: _damage_blob(tmp_path, cut=False),
    "blob cut short": lambda tmp_path, key_file: _damage_blob(tmp_path, cut=True),
    "another stack": _foreign_stack,
}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A store node a filled (its model copy, its key), and node b's plain load of its own copy: what
    every refusal test starts from, made once."""
    root = tmp_path_factory.mktemp("published")
    model = build_bert(root / "built")
    a, b = Node.pair(root, "file://" + str(root / "store"))
    try:
        _published_by_a(root, a, model)
        path_b = copy_model(model, root / "b" / "bert")
        return {"store": root / "store", "key_file": a.env["OVERMIND_FLEET_KEY_FILE"], "path_b": path_b,
                "plain": _plain(b, path_b)}
    finally:
        a.stop()
        b.stop()


def _node_b(tmp_path, published, key_file: str | None = None) -> Node:
    """A fresh node b over a copy of the published store (``tmp_path/store``)."""
    shutil.copytree(published["store"], tmp_path / "store")
    return Node("b", "file://" + str(tmp_path / "store"), key_file or published["key_file"])


@pytest.mark.long(10)
@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_entry_is_refused_with_one_warning_and_the_load_is_plain(tmp_path, published, tamper):
    b = _node_b(tmp_path, published)
    try:
        TAMPERS[tamper](tmp_path, published["key_file"])
        got = _run(b, published["path_b"])
        assert _same(got, published["plain"])
        # one warning a load (the model's, the tokenizer's), each saying why
        assert len(got["warnings"]) == 2, got["warnings"]
        assert all("refused the fleet's entry" in w and REASONS[tamper] in w for w in got["warnings"])
        st = b.status()
        assert st["fleet_imports"] == 0 and st["publishes"] >= 1  # B built its own
    finally:
        b.stop()


@pytest.mark.long(10)
def test_an_entry_signed_with_another_key_is_refused(tmp_path, published):
    b = _node_b(tmp_path, published, key_file=write_fleet_key(tmp_path))
    try:
        got = _run(b, published["path_b"])
        assert _same(got, published["plain"])
        assert len(got["warnings"]) == 2 and all("bad signature" in w for w in got["warnings"])
    finally:
        b.stop()


@pytest.mark.long(10)
def test_the_untouched_store_serves_node_b(tmp_path, published):
    b = _node_b(tmp_path, published)  # the control: the same store, untouched, is imported
    try:
        got = _run(b, published["path_b"])
        assert _same(got, published["plain"]) and not got["warnings"]
        assert b.status()["fleet_imports"] == 2
    finally:
        b.stop()


@pytest.mark.long(20)
def test_a_store_that_is_down_costs_one_warning_and_the_load_is_plain(tmp_path, model, seaweed):
    env = {**seaweed.env, "AWS_ENDPOINT_URL": closed_endpoint(), "OVERMIND_FLEET_TIMEOUT": "2"}
    node = Node("a", "s3://overmind/down", write_fleet_key(tmp_path), env)
    try:
        path = copy_model(model, tmp_path / "a" / "bert")
        got = _run(node, path)
        assert _same(got, _plain(node, path))
        # one warning a process: the store is left alone for a while after it failed
        assert len(got["warnings"]) == 1 and "cannot read the fleet's store" in got["warnings"][0]
        assert got["load_s"] < 30
        deadline = time.monotonic() + 30
        while not node.status().get("fleet_upload_failures"):  # the server's upload failed: counted
            assert time.monotonic() < deadline, node.status()
            time.sleep(0.2)
        assert node.status()["publishes"] >= 1  # the node's own cache still serves
    finally:
        node.stop()


@pytest.mark.long(30)
def test_a_stalled_store_costs_at_most_the_fleet_timeout(tmp_path, model, s3_url, seaweed):
    a, b = Node.pair(tmp_path, s3_url, {**seaweed.env, "OVERMIND_FLEET_TIMEOUT": "2"})
    try:
        _published_by_a(tmp_path, a, model)
        path_b = copy_model(model, tmp_path / "b" / "bert")
        plain = _plain(b, path_b)
        with seaweed.paused():
            got = _run(b, path_b)
        assert _same(got, plain)
        assert len(got["warnings"]) == 1 and "cannot read the fleet's store" in got["warnings"][0]
        assert got["load_s"] < 2 * 2 + 10  # one read that waited out the timeout (2 attempts)
    finally:
        a.stop()
        b.stop()


@pytest.mark.long(20)
def test_eviction_on_a_node_leaves_the_store_alone(tmp_path, model, nodes):
    a, b = nodes
    _published_by_a(tmp_path, a, model)
    refs = sorted(os.listdir(tmp_path / "store" / "refs"))
    subprocess.run([sys.executable, "-m", "overmind", "evict", "--all"], env={**os.environ, **a.env},
                   check=True, capture_output=True)
    assert a.status()["entries"] == 0
    assert sorted(os.listdir(tmp_path / "store" / "refs")) == refs
    path_b = copy_model(model, tmp_path / "b" / "bert")
    got = _run(b, path_b)
    assert _same(got, _plain(b, path_b)) and not got["warnings"]
    assert b.status()["fleet_imports"] == 2


@pytest.mark.long(30)
def test_two_nodes_uploading_one_entry_at_once_are_fine(tmp_path, model, nodes):
    a, b = nodes
    paths = {a: copy_model(model, tmp_path / "a" / "bert"), b: copy_model(model, tmp_path / "b" / "bert")}
    runs = [threading.Thread(target=_run, args=(node, paths[node])) for node in (a, b)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    a.wait_uploads(1)
    b.wait_uploads(1)
    c = Node("c", a.env["OVERMIND_FLEET"], a.env["OVERMIND_FLEET_KEY_FILE"])
    try:
        path_c = copy_model(model, tmp_path / "c" / "bert")
        got = _run(c, path_c)
        assert _same(got, _plain(c, path_c)) and not got["warnings"]
        assert c.status()["fleet_imports"] == 2
    finally:
        c.stop()


@pytest.mark.long(30)
def test_an_exported_oci_layout_imported_on_another_node_serves_its_loads(tmp_path, model):
    key_file = write_fleet_key(tmp_path)
    a = Node("a", "file://" + str(tmp_path / "store-a"), key_file)
    b = Node("b", "file://" + str(tmp_path / "store-b"), key_file)
    layout = tmp_path / "layout"
    try:
        _run(a, copy_model(model, tmp_path / "a" / "bert"))
        a.wait_uploads(2)
        out = subprocess.run([sys.executable, "-m", "overmind", "export", "--all", str(layout), "--json"],
                             env={**os.environ, **a.env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        exported = json.loads(out.stdout)["exported"]
        assert len(exported) == a.status()["fleet_uploads"] >= 2  # nested loads' entries too
        index = json.loads((layout / "index.json").read_text())
        assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
        assert sorted(m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]) == \
            sorted(exported)
        out = subprocess.run([sys.executable, "-m", "overmind", "import", str(layout), "--json"],
                             env={**os.environ, **b.env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert sorted(json.loads(out.stdout)["imported"]) == sorted(exported)
        assert not json.loads(out.stdout)["refused"]
        path_b = copy_model(model, tmp_path / "b" / "bert")
        got = _run(b, path_b)
        assert _same(got, _plain(b, path_b)) and not got["warnings"]
        st = b.status()
        assert st["fleet_imports"] == 2 and st["publishes"] == 0
        # what B imported, B exports again: its manifests name the ids the skeletons hold
        again = tmp_path / "layout-b"
        out = subprocess.run([sys.executable, "-m", "overmind", "export", "--all", str(again)],
                             env={**os.environ, **b.env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        c = Node("c", "file://" + str(again), key_file)
        try:
            path_c = copy_model(model, tmp_path / "c" / "bert")
            got = _run(c, path_c)
            assert _same(got, _plain(c, path_c)) and not got["warnings"]
            assert c.status()["fleet_imports"] == 2
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()
