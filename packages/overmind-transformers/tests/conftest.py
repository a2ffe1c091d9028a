"""Fixtures for the transformers adapter's tests: tiny models built once per session, and a runner for fresh
processes that load through a private Overmind server."""
from __future__ import annotations

import itertools
import json
import os
import textwrap

import pytest

TESTS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
# Test-fixture adapters of the core's own suite are installed in the dev venv; they are not part of a user's setup.
OTHER_ADAPTERS_OFF = "fixture,fixture_broken,future"

PRELUDE = '''
import hashlib, json, os, sys, warnings
import torch
import overmind
from overmind.client import get_client
from overmind.testing import overmind_mapped, report
import tiny_models as tm

P = json.loads(os.environ["TINY"])


def server_state():
    entries = get_client().ls()
    return {"entries": len(entries), "hits": sum(e["hits"] for e in entries)}


def all_mapped(module):
    tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.numel()]
    return bool(tensors) and all(overmind_mapped(t.data_ptr()) for t in tensors)


def counted_load(fn):
    """(object, new entries on the server, new hits) for one load."""
    before = server_state()
    obj = fn()
    after = server_state()
    return obj, after["entries"] - before["entries"], after["hits"] - before["hits"]
'''


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Folders of the tiny models (see tests/tiny_models.py), built once per session."""
    import tiny_models as tm

    root = tmp_path_factory.mktemp("tiny-transformers")
    return {
        "llama": str(tm.build_llama(root / "llama")),
        "bert": str(tm.build_bert(root / "bert")),
        "remote": str(tm.build_remote_code_model(root / "tiny_remote")),
        "processor": str(tm.build_clip_processor(root / "clip-processor")),
        "feature_extractor": str(tm.build_feature_extractor(root / "feature-extractor")),
        "minilm": str(tm.minilm_path()),
    }


@pytest.fixture
def fresh(overmind_runtime, tiny, tmp_path):
    """``fresh(script, **env)``: run ``script`` after :data:`PRELUDE` in a new interpreter against this test's
    server; returns what it ``report``-ed. Every run gets its own empty ``HF_MODULES_CACHE`` unless given one,
    so no run can import remote code another run left on disk. ``OVERMIND_STRICT=1``: any fallback fails."""
    counter = itertools.count()

    def run(script: str, **env: str):
        from overmind.testing import run_fresh

        full_env = {
            "PYTHONPATH": TESTS_DIR, "OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1",
            "OVERMIND_DISABLED_ADAPTERS": OTHER_ADAPTERS_OFF, "TINY": json.dumps(tiny),
            "HF_MODULES_CACHE": str(tmp_path / f"modules-{next(counter)}"), "TOKENIZERS_PARALLELISM": "false",
        }
        full_env.update(env)
        return run_fresh(PRELUDE + textwrap.dedent(script), env=full_env, timeout=600)

    return run
