"""An export is a valid OCI image layout (oci-layout, index.json, one image manifest per entry, every blob
named by its digest) and also a file:// store that a node downloads from."""
from __future__ import annotations

import hashlib
import json
import os

from overmind.fleet import oci
from overmind.fleet.config import open_store
from overmind.fleet.dir_store import DirStore
from overmind.fleet.transfer import digest_of, download, upload

KEYS = [hashlib.sha256(b"entry %d" % i).hexdigest() for i in range(2)]


def memfd(data: bytes) -> int:
    fd = os.memfd_create("test")
    os.write(fd, data)
    return fd


def _read_json(path):
    with open(path, "rb") as f:
        return json.load(f)


def test_an_export_is_an_oci_layout_and_a_store(store, fleet_key, stack, tmp_path):
    shared = memfd(os.urandom(5000))
    mains = [memfd(os.urandom(1000 + i)) for i in range(2)]
    for pkey, main in zip(KEYS, mains):
        upload(store, fleet_key, pkey, stack, "e" + pkey[:4], {"label": pkey[:8]}, main, [("s", shared, "entry")])
    layout = tmp_path / "layout"
    assert oci.export([(k, store.get_ref(k), store) for k in KEYS], str(layout)) == sorted(KEYS)

    assert _read_json(layout / "oci-layout") == {"imageLayoutVersion": "1.0.0"}
    index = _read_json(layout / "index.json")
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.INDEX_TYPE
    named = {d["annotations"][oci.REF_NAME]: d for d in index["manifests"]}
    assert sorted(named) == sorted(KEYS)
    for blob in (layout / "blobs" / "sha256").iterdir():  # every blob file is named by its digest
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    for pkey, main in zip(KEYS, mains):
        descriptor = named[pkey]
        path = layout / "blobs" / "sha256" / descriptor["digest"].removeprefix("sha256:")
        assert descriptor["mediaType"] == oci.MANIFEST_TYPE and descriptor["size"] == path.stat().st_size
        image = json.loads(path.read_bytes())
        assert image["schemaVersion"] == 2 and image["config"]["mediaType"] == oci.CONFIG_TYPE
        config = layout / "blobs" / "sha256" / image["config"]["digest"].removeprefix("sha256:")
        assert config.read_bytes() == store.get_ref(pkey) and image["config"]["size"] == config.stat().st_size
        assert [layer["digest"] for layer in image["layers"]] == ["sha256:" + digest_of(fd)[0] for fd in (main, shared)]
        assert all(layer["mediaType"] == oci.LAYER_TYPE for layer in image["layers"])

    exported = open_store(f"file://{layout}", timeout=1)
    assert exported.refs() == sorted(KEYS)
    got = download(exported, fleet_key, KEYS[1], stack)
    assert os.pread(got.main[1], 5000, 0) == os.pread(mains[1], 5000, 0)
    got.close()
    for fd in [shared, *mains]:
        os.close(fd)


def test_write_layout_lists_what_upload_put_in_a_directory(tmp_path, fleet_key, stack):
    store = DirStore(str(tmp_path))
    main = memfd(b"main")
    upload(store, fleet_key, KEYS[0], stack, "e1", {}, main, [])
    assert oci.write_layout(str(tmp_path)) == [KEYS[0]]
    assert oci.export([], str(tmp_path)) == [KEYS[0]]  # an export adds to what the layout holds
    os.close(main)
