"""The fleet tests' stores: ``store`` runs a test on a directory store and on a bucket of a real SeaweedFS
server (``_support.seaweed``); ``fleet_key`` and ``stack`` are what an upload signs with and for."""
from __future__ import annotations

import os

import pytest

from overmind.fleet.config import open_store


@pytest.fixture(params=["dir", "s3"])
def store_url(request, tmp_path) -> str:
    if request.param == "dir":
        return "file://" + str(tmp_path / "fleet")
    return request.getfixturevalue("s3_url")


@pytest.fixture
def store(store_url):
    return open_store(store_url, timeout=10)


@pytest.fixture
def fleet_key() -> bytes:
    return os.urandom(32)


@pytest.fixture
def stack() -> dict:
    return {"python": "3.11.9 cpython", "machine": "x86_64", "torch": "2.5.1", "cuda": None, "cuda_arch": [],
            "distributions": {"overmind": "0.1.0", "torch": "2.5.1"}}
