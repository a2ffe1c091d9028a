"""Signed manifests: what the fleet key signed for this key and stack verifies; anything else is refused with a
reason (malformed, unsigned, signature, foreign), including every change of even one byte of the signed form."""
from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

from overmind.fleet.errors import Refused
from overmind.fleet.manifest import BlobRef, blobs, build, canonical, sign, verify

PKEY = hashlib.sha256(b"portable key").hexdigest()
KEY = b"k" * 32
STACK = {"python": "3.11.9 cpython", "machine": "x86_64", "torch": "2.5.1", "cuda": None, "cuda_arch": [],
         "distributions": {"torch": "2.5.1"}}
MAIN = BlobRef("e1", hashlib.sha256(b"main").hexdigest(), 4, "entry")
DEPS = [BlobRef("e0", hashlib.sha256(b"dep").hexdigest(), 3, "entry"),
        BlobRef("f0", hashlib.sha256(b"file").hexdigest(), 4, "file")]
META = {"loader": "transformers.AutoModel.from_pretrained", "nbytes": 4, "label": "tiny-bert"}


def signed(meta=META, key=KEY, pkey=PKEY, stack=STACK) -> bytes:
    return sign(build(pkey, stack, "e1", meta, MAIN, DEPS), key)


def refused(data: bytes, key=KEY, pkey=PKEY, stack=STACK) -> str:
    with pytest.raises(Refused) as caught:
        verify(data, key, pkey, stack)
    return caught.value.reason


def test_a_signed_manifest_verifies_and_names_its_blobs():
    manifest = verify(signed(), KEY, PKEY, STACK)
    assert manifest["entry_id"] == "e1" and manifest["meta"] == META and "signature" not in manifest
    assert blobs(manifest) == (MAIN, DEPS)


def test_signing_is_deterministic_and_resigning_replaces_the_signature():
    assert signed() == signed()
    assert sign(json.loads(signed(key=b"x" * 32)), KEY) == signed()


def test_unsigned_is_refused():
    assert refused(canonical(build(PKEY, STACK, "e1", META, MAIN, DEPS))) == "unsigned"


def test_one_byte_of_meta_changed_is_refused():
    data = signed()
    at = data.index(b"tiny-bert")
    assert refused(data[:at] + b"T" + data[at + 1:]) == "signature"


def test_another_key_is_refused():
    assert refused(signed(key=b"another fleet key!")) == "signature"


def test_another_stack_is_refused_naming_what_differs():
    with pytest.raises(Refused, match="torch") as caught:
        verify(signed(), KEY, PKEY, {**STACK, "torch": "2.6.0"})
    assert caught.value.reason == "foreign"


def test_another_portable_key_is_refused():
    assert refused(signed(), pkey=hashlib.sha256(b"other").hexdigest()) == "foreign"


@pytest.mark.parametrize("data", [b"", b"not json", b"\xff\xfe", b"[1, 2]", b'"text"', b"{" * 100000,
                                  b'{"signature": 5}'])
def test_what_is_not_a_manifest_is_malformed(data):
    assert refused(data) == "malformed"


def test_a_signed_manifest_of_the_wrong_shape_is_malformed():
    body = build(PKEY, STACK, "e1", META, MAIN, DEPS)
    body["main"]["size"] = -1
    assert refused(sign(body, KEY)) == "malformed"
    body = build(PKEY, STACK, "e1", META, MAIN, DEPS)
    body["version"] = 2
    assert refused(sign(body, KEY)) == "malformed"


def test_the_same_manifest_spelt_otherwise_is_refused():
    data = signed()
    assert refused(json.dumps(json.loads(data), indent=1).encode()) == "malformed"


@settings_h(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_change_of_one_byte_is_refused(data):
    original = signed()
    at = data.draw(st.integers(0, len(original) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != original[at]))
    assert refused(original[:at] + bytes([byte]) + original[at + 1:]) in ("malformed", "unsigned", "signature", "foreign")


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=10)


@settings_h(max_examples=100, deadline=None)
@given(meta=st.dictionaries(st.text(), _JSON, max_size=4))
def test_any_json_meta_round_trips(meta):
    assert verify(signed(meta=meta), KEY, PKEY, STACK)["meta"] == meta
