"""Cache keys in one process: binding, aliases folded by hooks, secrets kept out of `ls`, paths."""
from __future__ import annotations

import os

import pytest
import torch

from overmind.keys import key


def loader(path, token=None, revision="main", **kwargs):
    return path


def test_binding_applies_defaults_and_flattens_kwargs():
    ld = key.describe_loader(loader)
    a = key.bind_arguments(ld, ("x",), {"variant": "fp16"})
    b = key.bind_arguments(ld, (), {"variant": "fp16", "path": "x", "revision": "main"})
    assert a == b == {"path": "x", "token": None, "revision": "main", "variant": "fp16"}
    assert key.make_key(ld, a).key == key.make_key(ld, b).key


def test_secrets_are_not_shown_in_summaries():
    ld = key.describe_loader(loader)
    args = key.bind_arguments(ld, ("x",), {"token": "hf_secret123", "api_key": "k"})
    summary = key.make_key(ld, args).summary
    assert "hf_secret123" not in summary and "token=***" in summary and "api_key=***" in summary


def test_paths_are_fingerprinted_and_change_with_the_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"1")
    ld = key.describe_loader(loader)
    k1 = key.make_key(ld, key.bind_arguments(ld, (str(tmp_path),), {})).key
    (tmp_path / "b.bin").write_bytes(b"2")
    k2 = key.make_key(ld, key.bind_arguments(ld, (str(tmp_path),), {})).key
    os.utime(tmp_path / "a.bin", ns=(1, 1))
    k3 = key.make_key(ld, key.bind_arguments(ld, (str(tmp_path),), {})).key
    assert len({k1, k2, k3}) == 3


def test_values_without_a_visible_state_are_refused():
    import threading

    with pytest.raises(key.Unkeyable, match="state Python cannot see"):
        key.canon(threading.Lock())
    with pytest.raises(key.Unkeyable, match="Generator"):
        key.canon(torch.Generator())
    assert key.canon(torch.float16) == ("torch", "dtype", "torch.float16")
    # A dict's insertion order is what a loader iterating it sees: it is part of the value.
    assert key.canon({"b": 1, "a": [1, 2]}) != key.canon({"a": [1, 2], "b": 1})
    assert key.canon({"b": 1, "a": [1, 2]}) == key.canon({"b": 1, "a": [1, 2]})


def test_pathlib_paths_are_keyed_by_their_fingerprint(tmp_path):
    """A pathlib path's slots hold parts like "/"; only its string names what the loader reads."""
    import pathlib

    (tmp_path / "a.bin").write_bytes(b"1")
    ld = key.describe_loader(loader)
    k1 = key.make_key(ld, key.bind_arguments(ld, (pathlib.Path(tmp_path),), {})).key
    assert k1 == key.make_key(ld, key.bind_arguments(ld, (pathlib.Path(str(tmp_path)),), {})).key
    (tmp_path / "a.bin").write_bytes(b"22")
    assert key.make_key(ld, key.bind_arguments(ld, (pathlib.Path(tmp_path),), {})).key != k1


class Embedder(torch.nn.Module):
    """A loader that is a class: ``overmind.load(Embedder, 3)`` caches its construction."""

    def __init__(self, n, scale=1.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((n,), scale))


def test_a_class_is_a_loader_its_construction_keyed_by_the_arguments_of_its_init(overmind_runtime):
    import overmind
    from overmind.client.connection import get_client

    ld = key.describe_loader(Embedder)
    assert ld.owner is None and ld.func is Embedder and ld.name.endswith(".Embedder")
    assert key.bind_arguments(ld, (3,), {}) == {"n": 3, "scale": 1.0}
    k = key.make_key(ld, key.bind_arguments(ld, (3,), {})).key
    assert k == key.make_key(ld, key.bind_arguments(ld, (), {"n": 3, "scale": 1.0})).key
    assert k != key.make_key(ld, key.bind_arguments(ld, (4,), {})).key
    first, second = overmind.load(Embedder, 3, scale=2.0), overmind.load(Embedder, 3, scale=2.0)
    assert type(second) is Embedder and second is not first and torch.equal(second.weight, first.weight)
    assert sum(e["hits"] for e in get_client().ls()) == 1


def test_the_digest_is_of_the_declared_parts_in_their_order():
    """What ``make_key`` hashes is exactly ``KEY_VERSION`` then each of ``PARTS``' values, in
    declaration order."""
    import hashlib

    ld = key.describe_loader(loader)
    ck = key.make_key(ld, key.bind_arguments(ld, ("x",), {}), [("files", 1)])
    assert len(ck.described) == len(key.PARTS)
    assert ck.ambient == ck.described[key.PARTS.index(key.TORCH_STATE)]
    material = repr((key.KEY_VERSION, *ck.described)).encode("utf-8", "surrogatepass")
    assert ck.key == hashlib.sha256(material).hexdigest()[:40]


@pytest.mark.parametrize("part", key.PARTS, ids=lambda part: part.name)
def test_a_change_in_each_part_is_said_in_its_words(part):
    """``what_changed`` names every part whose value differs, in ``PARTS``' order, with the part's
    own words."""
    ld = key.describe_loader(loader)
    ck = key.make_key(ld, key.bind_arguments(ld, ("x",), {}))
    at = key.PARTS.index(part)
    changed = (("path", "y"),) if part.name == "arguments" else ("another", "value")
    described = ck.described[:at] + (changed,) + ck.described[at + 1:]
    after = key.CacheKey("other", ck.summary, ck.ambient, described)
    assert key.what_changed(ck, after) == part.change(ck.described[at], changed)
    assert key.what_changed(ck, ck) == "its key"


def test_what_changed_names_the_arguments_and_the_state_that_moved():
    ld = key.describe_loader(loader)
    before = key.make_key(ld, key.bind_arguments(ld, ("x",), {"revision": "a"}))
    after = key.make_key(ld, key.bind_arguments(ld, ("y",), {"revision": "b"}), ["file"])
    assert key.what_changed(before, after) == \
        "its arguments 'path', 'revision' and the files it reads (or another part an adapter keys)"
    torch.set_default_dtype(torch.float64)
    try:
        moved = key.make_key(ld, key.bind_arguments(ld, ("x",), {"revision": "a"}))
    finally:
        torch.set_default_dtype(torch.float32)
    said = key.what_changed(before, moved)
    assert said == "torch's process state (default dtype or device, a mode)"
