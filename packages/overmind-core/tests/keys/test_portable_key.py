"""Portable keys (keys/portable.py): equal on every node for the same call, files and stack, wherever the files lie
and whatever their inodes and times; local keys outside portable_mode() as they are."""
from __future__ import annotations

import asyncio
import os
import shutil
import string
import tempfile
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overmind.adapters import hooks
from overmind.keys import content_digest, fingerprint, key, portable

PLAIN = ("torch.float32", "cpu", False, ())


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.setattr(content_digest, "_memory", {})
    monkeypatch.setattr(content_digest, "_db", None)


def read_files(path, encoding="utf-8"):
    """A loader reading a folder: what ``overmind.load(read_files, path)`` caches."""
    return {name: open(os.path.join(path, name), encoding=encoding).read() for name in sorted(os.listdir(path))}


def _keys(fn, *args, **kwargs) -> tuple[str, str]:
    """(local key, portable key) of a call, made as ``overmind.load`` makes its key."""
    loader = key.describe_loader(fn)
    arguments = key.bind_arguments(loader, args, kwargs)
    local = key.make_key(loader, arguments, hooks.key_parts(loader, arguments), hooks.key_for_value).key
    fleet = portable.portable_key(loader, arguments, lambda: hooks.key_parts(loader, arguments),
                                  hooks.key_for_value)
    return local, fleet


def _write(folder, files: dict[str, bytes], mtime_ns: int) -> str:
    for name, data in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return str(folder)


def test_plain_files_elsewhere_share_the_portable_key_only(tmp_path):
    files = {"config.json": b'{"a": 1}', "sub/vocab.txt": b"x\ny\n"}
    a = _write(tmp_path / "node-a" / "model", files, 10**18)
    b = _write(tmp_path / "b", dict(reversed(files.items())), 2 * 10**18)  # other inodes, other times
    (local_a, fleet_a), (local_b, fleet_b) = _keys(read_files, a), _keys(read_files, b)
    assert fleet_a == fleet_b and len(fleet_a) == 64
    assert local_a != local_b
    with open(os.path.join(b, "config.json"), "wb") as f:
        f.write(b'{"a": 2}')
    assert _keys(read_files, b)[1] != fleet_a
    assert _keys(read_files, a, encoding="latin-1")[1] != fleet_a  # the arguments are still the key's


def test_a_single_file_path_by_str_bytes_and_pathlib(tmp_path):
    import pathlib

    def read(path):
        return open(path, "rb").read()

    a = _write(tmp_path / "a", {"w.bin": b"w"}, 10**18) + "/w.bin"
    b = _write(tmp_path / "b", {"w.bin": b"w"}, 2 * 10**18) + "/w.bin"
    for convert in (str, os.fsencode, pathlib.Path):
        assert _keys(read, convert(a))[1] == _keys(read, convert(b))[1]
        assert _keys(read, convert(a))[0] != _keys(read, convert(b))[0]
    assert _keys(read, a)[1] != _keys(read, os.fsencode(a))[1]  # a loader can tell str from bytes


@pytest.fixture(scope="module")
def activated():
    import overmind

    overmind.activate()
    yield
    overmind.deactivate()


def _tiny_model(seed: int):
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=64))


def test_a_transformers_model_saved_twice_shares_the_portable_key(tmp_path, activated):
    import transformers

    from overmind.adapters import patching

    model = _tiny_model(0)
    model.save_pretrained(tmp_path / "one")
    shutil.copytree(tmp_path / "one", tmp_path / "elsewhere" / "two", copy_function=shutil.copy)  # new times
    _tiny_model(1).save_pretrained(tmp_path / "other-weights")
    original = patching.get_original(transformers.PreTrainedModel, "from_pretrained")
    load = original.__get__(None, transformers.LlamaForCausalLM)  # what a patched from_pretrained hands to load()
    one, two = _keys(load, str(tmp_path / "one")), _keys(load, str(tmp_path / "elsewhere" / "two"))
    assert one[1] == two[1] and one[0] != two[0]
    assert _keys(load, str(tmp_path / "other-weights"))[1] != one[1]
    assert _keys(load, str(tmp_path / "one"), dtype=torch.float16)[1] != one[1]


def test_a_changed_stack_changes_the_portable_key(tmp_path, monkeypatch):
    folder = _write(tmp_path / "m", {"w.bin": b"w"}, 10**18)
    here = portable.stack()
    assert set(here) == {"python", "machine", "torch", "cuda", "cuda_arch", "distributions"}
    assert here["torch"] == here["distributions"]["torch"] == torch.__version__
    before = _keys(read_files, folder)
    for change in ({"cuda_arch": ["9.0"]}, {"torch": "0.0"}, {"distributions": {**here["distributions"], "x": "1"}}):
        monkeypatch.setattr(portable, "stack", lambda change=change: {**here, **change})
        after = _keys(read_files, folder)
        assert after[0] == before[0] and after[1] != before[1]
    assert portable.stack_digest({"b": 1, "a": [2]}) == portable.stack_digest({"a": [2], "b": 1})


def test_the_hub_adapters_snapshot_files_are_described_by_content(tmp_path):
    from overmind_hf import hub

    blob = "d" * 64
    for node in ("a", "b"):
        snap = tmp_path / node / "models--org--tiny" / "snapshots" / ("c" * 40)
        (tmp_path / node / "models--org--tiny" / "blobs").mkdir(parents=True)
        (tmp_path / node / "models--org--tiny" / "blobs" / blob).write_bytes(node.encode() * 100)
        snap.mkdir(parents=True)
        os.symlink(os.path.join("..", "..", "blobs", blob), snap / "model.safetensors")
    parts = {node: hub.snapshot_files("org/tiny", "model", "c" * 40, str(tmp_path / node)) for node in "ab"}
    assert parts["a"] != parts["b"]  # local: each node's inodes and times
    with portable.portable_mode():
        parts = {node: hub.snapshot_files("org/tiny", "model", "c" * 40, str(tmp_path / node)) for node in "ab"}
    # the blob's name, not its bytes (which differ here): the Hub's own digest of the file
    assert parts["a"] == parts["b"] == (("", "folder"), ("model.safetensors", 100, blob))


def test_the_timm_adapters_local_dir_part_is_described_by_content(tmp_path):
    from overmind_timm import plugin

    a = _write(tmp_path / "a", {"config.json": b"{}"}, 10**18)
    b = _write(tmp_path / "b", {"config.json": b"{}"}, 2 * 10**18)
    with portable.portable_mode():
        assert plugin._create_model_parts({"model_name": f"local-dir:{a}"}) == \
            plugin._create_model_parts({"model_name": f"local-dir:{b}"})
    assert plugin._create_model_parts({"model_name": f"local-dir:{a}"}) != \
        plugin._create_model_parts({"model_name": f"local-dir:{b}"})


def test_portable_mode_is_this_threads_and_tasks_alone(tmp_path):
    path = _write(tmp_path, {"w.bin": b"w"}, 10**18) + "/w.bin"
    seen: list[tuple] = []
    with portable.portable_mode():
        assert portable.active() and fingerprint.fingerprint(path)[0] == "content"
        other = threading.Thread(target=lambda: seen.append(fingerprint.fingerprint(path)))
        other.start()
        other.join()
    assert not portable.active() and seen[0][0] != "content"

    async def both():
        async def portable_task():
            with portable.portable_mode():
                await asyncio.sleep(0.01)
                return fingerprint.fingerprint(path)

        async def local_task():
            await asyncio.sleep(0.005)
            return fingerprint.fingerprint(path)

        return await asyncio.gather(portable_task(), local_task())

    inside, outside = asyncio.run(both())
    assert inside[0] == "content" and outside == fingerprint.fingerprint(path)


def test_an_unreadable_file_is_unkeyable_not_keyed_by_its_spelling(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with portable.portable_mode(), pytest.raises(key.Unkeyable, match="not a regular file"):
        key.canon(str(tmp_path / "pipe"))


_NAMES = st.text(alphabet=string.ascii_lowercase[:3], min_size=1, max_size=2)
_TREES = st.dictionaries(st.lists(_NAMES, min_size=1, max_size=3).map("/".join), st.binary(max_size=8),
                         max_size=5).filter(lambda t: not any(b.startswith(a + "/") for a in t for b in t))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_TREES, _TREES, st.booleans())
def test_portable_fingerprints_are_equal_iff_names_and_contents_are(first, second, same):
    if same:
        second = dict(first)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        _write(a, first, 10**18)
        _write(b, dict(reversed(second.items())), 2 * 10**18)
        with portable.portable_mode():
            fa, fb = fingerprint.fingerprint(a), fingerprint.fingerprint(b)
    assert (fa == fb) == (first == second)
