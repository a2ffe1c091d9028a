"""Export entries as an OCI image layout that is also a ``file://`` fleet store.

>>> export([(pkey, manifest_bytes, fleet_store)], "/tmp/layout")   # then: OVERMIND_FLEET=file:///tmp/layout
>>> sorted(os.listdir("/tmp/layout"))
['blobs', 'index.json', 'oci-layout', 'refs']

An OCI layout keeps blobs at ``blobs/sha256/<hex>``, as a fleet store does, so one folder serves both: a
registry client (oras, skopeo), Dragonfly or a Kubernetes image volume carries it to a node, and a node imports
from it as from any store. Each entry is one image manifest: its config is the signed entry manifest
(:data:`CONFIG_TYPE`), its layers the entry's blobs (:data:`LAYER_TYPE`), and ``index.json`` names it by its
portable key (``org.opencontainers.image.ref.name``). The layout adds nothing the signature does not cover that
an import trusts: a node reads ``refs/`` and verifies as it would any store.
"""
from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Iterable

from .dir_store import DirStore
from .manifest import BlobRef, blobs
from .stores import Store

CONFIG_TYPE = "application/vnd.overmind.entry.v1+json"
LAYER_TYPE = "application/vnd.overmind.blob.v1"
ARTIFACT_TYPE = "application/vnd.overmind.entry.v1"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def export(entries: Iterable[tuple[str, bytes, Store]], dir: str) -> list[str]:
    """Write each ``(portable key, signed manifest, store holding its blobs)`` of ``entries`` into the layout
    at ``dir`` (created, or added to), then its ``index.json``. Returns the portable keys the layout holds."""
    out = DirStore(dir)
    for portable_key, data, source in entries:
        for ref in _refs(portable_key, data):
            if not out.has_blob(ref.digest):
                with source.open_blob(ref.digest) as stream:
                    out.put_blob(ref.digest, stream, ref.size)
        out.put_ref(portable_key, data)
    return write_layout(dir)


def write_layout(dir: str) -> list[str]:
    """Write ``oci-layout``, one image manifest per ref and ``index.json`` for the fleet store at ``dir``
    (whose blobs and refs are in place, e.g. written by :func:`~overmind.fleet.transfer.upload`). Returns the
    portable keys listed."""
    out = DirStore(dir)
    listed = []
    for portable_key in out.refs():
        data = out.get_ref(portable_key)
        if data is None:
            continue
        config = _put(out, data, CONFIG_TYPE)
        layers, seen = [], set()
        for ref in _refs(portable_key, data):
            if ref.digest not in seen:
                seen.add(ref.digest)
                layers.append({"mediaType": LAYER_TYPE, "digest": "sha256:" + ref.digest, "size": ref.size})
        image = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE, "config": config,
                 "layers": layers, "annotations": {REF_NAME: portable_key}}
        descriptor = _put(out, _json(image), MANIFEST_TYPE)
        listed.append({**descriptor, "annotations": {REF_NAME: portable_key}})
    out.put_file("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    out.put_file("index.json", _json({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": listed}))
    return [d["annotations"][REF_NAME] for d in listed]


def _refs(portable_key: str, data: bytes) -> list[BlobRef]:
    try:
        main, deps = blobs(json.loads(data))
        return [main, *deps]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"the fleet entry {portable_key} is not a manifest ({exc}); export entries of a "
                         "fleet store or of transfer.upload") from exc


def _put(out: DirStore, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    out.put_blob(digest, io.BytesIO(data), len(data))
    return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
