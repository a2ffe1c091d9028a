"""The fleet from the settings: none when OVERMIND_FLEET is unset or not a store URL (one warning); refused
without a usable key; built once and rebuilt when the key file changes; boto3 imported only for s3://."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from _support import pythonpath_env
from overmind import settings
from overmind.fallback import OvermindWarning
from overmind.fleet import config
from overmind.fleet.dir_store import DirStore
from overmind.fleet.errors import FleetConfigError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("OVERMIND_FLEET", "OVERMIND_FLEET_KEY_FILE", "OVERMIND_FLEET_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    settings.reload()
    yield
    with settings.quiet():  # a test's bad value is still set here: monkeypatch undoes it after this
        settings.reload()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "fleet.key"
    path.write_bytes(os.urandom(32).hex().encode() + b"\n")
    return path


def test_no_fleet_when_unset():
    assert config.fleet() is None


def test_a_url_that_is_no_store_warns_once_and_means_no_fleet(monkeypatch, key_file):
    monkeypatch.setenv("OVERMIND_FLEET", "ftp://example.com/fleet")
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(key_file))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config.fleet() is None and config.fleet() is None
    ours = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    assert len(ours) == 1 and "OVERMIND_FLEET" in ours[0] and "s3://bucket/prefix" in ours[0]


def test_the_fleet_is_built_once_and_again_when_its_key_changes(monkeypatch, tmp_path, key_file):
    monkeypatch.setenv("OVERMIND_FLEET", f"file://{tmp_path}/store/")
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(key_file))
    first = config.fleet()
    assert first.url == f"file://{tmp_path}/store" and isinstance(first.store, DirStore)
    assert first.key == key_file.read_bytes().strip() and config.fleet() is first
    key_file.write_bytes(b"another key of sixteen bytes or more")
    assert config.fleet().key == b"another key of sixteen bytes or more"


@pytest.mark.parametrize("problem", ["unset", "missing", "short", "folder"])
def test_a_fleet_without_a_usable_key_is_refused_saying_what_to_do(monkeypatch, tmp_path, problem):
    monkeypatch.setenv("OVERMIND_FLEET", f"file://{tmp_path}/store")
    path = tmp_path / "key"
    if problem == "short":
        path.write_bytes(b"short key\n")
    elif problem == "folder":
        path.mkdir()
    if problem != "unset":
        monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(path))
    with pytest.raises(FleetConfigError, match="OVERMIND_FLEET_KEY_FILE") as caught:
        config.fleet()
    assert "off until" in str(caught.value)


def test_the_timeout_setting_reaches_the_s3_client(monkeypatch, key_file, s3_url):
    monkeypatch.setenv("OVERMIND_FLEET", s3_url)
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(key_file))
    monkeypatch.setenv("OVERMIND_FLEET_TIMEOUT", "2.5")
    client_config = config.fleet().store._client.meta.config
    assert client_config.connect_timeout == 2.5 == client_config.read_timeout
    assert config.fleet().store.refs() == []


def test_boto3_is_imported_only_for_an_s3_fleet(tmp_path, key_file):
    script = ("import sys, overmind, overmind.server.daemon\nfrom overmind.fleet import config, transfer, oci\n"
              "f = config.fleet(); f.store.refs()\nprint('boto3' in sys.modules, 'botocore' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": pythonpath_env(), "OVERMIND_FLEET": f"file://{tmp_path}/store",
           "OVERMIND_FLEET_KEY_FILE": str(key_file)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr
