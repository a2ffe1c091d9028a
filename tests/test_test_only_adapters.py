"""The test-only adapters (tests/adapter_fixture*) exist for the tests alone: scripts/setup installs
them into ``.test-plugins``, which pytest and the processes a test starts have on their path, and not into the
venv, whose python (a user's code, the demo, ``overmind doctor``) neither discovers nor imports them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

from _support import TEST_PLUGINS_DIR, without_test_plugins

TEST_ONLY = {"fixture", "fixture_broken", "future"}

PROBE = """
import importlib.util, json
from importlib import metadata
print(json.dumps({"adapters": {ep.name: str(ep.dist._path) for ep in metadata.entry_points(group="overmind.adapters")},
                  "module": importlib.util.find_spec("overmind_fixture_adapter") is not None}))
"""


def _probe(env: dict[str, str]) -> tuple[dict[str, str], bool]:
    """The adapters' entry points a fresh python with ``env`` discovers, and whether it can import the fixture."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True, cwd="/")
    seen = json.loads(out.stdout)
    return seen["adapters"], seen["module"]


def test_pytest_discovers_them_from_the_test_plugins_folder():
    found = {ep.name: str(ep.dist._path) for ep in metadata.entry_points(group="overmind.adapters")}
    assert TEST_ONLY <= set(found), sorted(found)
    assert all(found[name].startswith(TEST_PLUGINS_DIR + os.sep) for name in TEST_ONLY), found


def test_a_process_a_test_starts_discovers_them_too():
    found, importable = _probe(dict(os.environ))
    assert TEST_ONLY <= set(found) and importable, found
    assert all(found[name].startswith(TEST_PLUGINS_DIR + os.sep) for name in TEST_ONLY), found


def test_the_venv_alone_has_none_of_them():
    env = without_test_plugins()
    found, importable = _probe(env)
    assert not TEST_ONLY & set(found) and not importable, found
    assert "transformers" in found, found
    doctor = subprocess.run([sys.executable, "-m", "overmind", "doctor", "--json"], env=env, capture_output=True,
                            text=True, cwd="/")
    names = {check["name"] for check in json.loads(doctor.stdout)["checks"]}
    assert "adapter transformers" in names and not {f"adapter {a}" for a in TEST_ONLY} & names, sorted(names)
