"""An entry's manifest: what a node needs to import it, signed with the fleet key (HMAC-SHA256).

>>> m = build(pkey, stack, "e1", meta, BlobRef("e1", digest, 4096, "entry"), [])
>>> data = sign(m, key)                       # canonical JSON bytes with "signature"
>>> verify(data, key, pkey, stack)["entry_id"]
'e1'

An entry is a pickle, and unpickling runs code: a node imports only what a holder of the fleet key signed.
The signed bytes are the manifest's canonical JSON (sorted keys, no spaces, ASCII); :func:`verify` accepts
exactly those bytes, so no change to them, not even one that parses to the same value, goes through. The
manifest names every blob by its sha256 and size, so the signature covers the blobs' bytes too (the download
checks each one). It also carries the portable key and the software stack, and :func:`verify` refuses an
entry signed for another key or stack: a valid entry of another stack must not load here.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, NamedTuple

from .errors import Refused
from .stores import is_name

FORMAT = "overmind-fleet-entry"
VERSION = 1
KINDS = ("entry", "file")


class BlobRef(NamedTuple):
    """One blob of an entry: the entry id it had on the node that built it, the sha256 hex of its bytes, its
    size, and its kind: ``"entry"`` (a pickled entry) or ``"file"`` (a file an entry references)."""

    entry_id: str
    digest: str
    size: int  # the bytes stored: the blob's data extents end to end
    kind: str
    span: int | None = None  # a sparse blob's whole length (None: dense, ``size`` long)
    extents: list | None = None  # a sparse blob's [offset, length] runs of data (``fleet/extents.py``)


def canonical(value: Any) -> bytes:
    """The one JSON spelling of ``value`` that is signed and verified."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def build(portable_key: str, stack: dict[str, Any], entry_id: str, meta: dict[str, Any], main: BlobRef,
          deps: list[BlobRef]) -> dict[str, Any]:
    """The manifest of one entry (unsigned). ``meta``: the entry's metadata as the server keeps it (JSON-ready);
    ``main``: the entry's own blob; ``deps``: the blobs of the entries and files it references."""
    return {"format": FORMAT, "version": VERSION, "portable_key": portable_key,
            "stack": json.loads(canonical(stack)), "entry_id": entry_id, "meta": json.loads(canonical(meta)),
            "main": main._asdict(), "deps": [d._asdict() for d in deps]}


def _mac(body: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical(body), hashlib.sha256).hexdigest()


def sign(manifest: dict[str, Any], key: bytes) -> bytes:
    """``manifest`` with its ``"signature"`` (HMAC-SHA256 of its canonical JSON under ``key``), as bytes."""
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return canonical({**body, "signature": _mac(body, key)})


def verify(data: bytes, key: bytes, portable_key: str, stack: dict[str, Any]) -> dict[str, Any]:
    """The manifest in ``data`` (without its signature), if ``key`` signed it for ``portable_key`` and
    ``stack``; else :class:`~overmind.fleet.errors.Refused` whose ``reason`` says why."""
    try:
        manifest = json.loads(data)
    except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Refused("malformed", f"the fleet entry {portable_key} is not JSON; it was not written by "
                                   "Overmind, or was damaged. Loading without it.") from None
    if not isinstance(manifest, dict):
        raise Refused("malformed", f"the fleet entry {portable_key} is not a manifest (JSON {type(manifest)})")
    if "signature" not in manifest:
        raise Refused("unsigned", f"the fleet entry {portable_key} is not signed; entries are signed with the "
                                  "fleet key (OVERMIND_FLEET_KEY_FILE) by the node that uploads them")
    body = {k: v for k, v in manifest.items() if k != "signature"}
    try:
        exact = canonical(manifest) == data
    except ValueError:
        exact = False
    if not exact or not isinstance(manifest["signature"], str):
        raise Refused("malformed", f"the fleet entry {portable_key} is not in the signed form (canonical JSON); "
                                   "it was changed after it was signed")
    if not hmac.compare_digest(manifest["signature"], _mac(body, key)):
        raise Refused("signature", f"the fleet entry {portable_key} has a bad signature: it was signed with "
                                   "another fleet key, or changed since. Check that every node reads the same "
                                   "OVERMIND_FLEET_KEY_FILE")
    problem = _shape_problem(body)
    if problem:
        raise Refused("malformed", f"the fleet entry {portable_key} is signed but malformed ({problem}); "
                                   "it was written by another version of Overmind")
    if body["portable_key"] != portable_key:
        raise Refused("foreign", f"the fleet entry stored as {portable_key} is signed for key "
                                 f"{body['portable_key']}; it was put there by hand. Loading without it.")
    if body["stack"] != json.loads(canonical(stack)):
        differ = sorted(k for k in set(body["stack"]) | set(stack) if body["stack"].get(k) != stack.get(k))
        raise Refused("foreign", f"the fleet entry {portable_key} was built on another software stack "
                                 f"(differs in {', '.join(differ) or 'its form'}); loading without it")
    return body


def blobs(manifest: dict[str, Any]) -> tuple[BlobRef, list[BlobRef]]:
    """The main blob and the dependency blobs a verified manifest names."""
    return BlobRef(**manifest["main"]), [BlobRef(**d) for d in manifest["deps"]]


def _shape_problem(body: dict[str, Any]) -> str | None:
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        return f"format {body.get('format')!r} version {body.get('version')!r}"
    for field, kind in (("portable_key", str), ("stack", dict), ("entry_id", str), ("meta", dict),
                        ("main", dict), ("deps", list)):
        if not isinstance(body.get(field), kind):
            return f"{field} is not a {kind.__name__}"
    for ref in [body["main"], *body["deps"]]:
        if not isinstance(ref, dict) or set(ref) != set(BlobRef._fields):
            return f"a blob reference is {ref!r:.200}"
        if not (isinstance(ref["entry_id"], str) and is_name(ref["digest"]) and type(ref["size"]) is int
                and ref["size"] >= 0 and ref["kind"] in KINDS and _sparse_ok(ref)):
            return f"a blob reference is {ref!r:.200}"
    return None


def _sparse_ok(ref: dict[str, Any]) -> bool:
    """A dense reference (no span, no extents), or extents in order inside the span, as many bytes as
    stored."""
    span, extents = ref["span"], ref["extents"]
    if span is None and extents is None:
        return True
    if type(span) is not int or not isinstance(extents, list):
        return False
    end = 0
    for item in extents:
        if not (isinstance(item, list) and len(item) == 2 and all(type(v) is int for v in item)
                and item[0] >= end and item[1] > 0):
            return False
        end = item[0] + item[1]
    return end <= span and sum(length for _, length in extents) == ref["size"]
