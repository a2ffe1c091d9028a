"""Fixtures for the transformers adapter's tests: tiny models built once per session, and a runner for fresh
processes that load through a private Overmind server (``fresh``, ``active``: tests/_support/adapter_testlib.py)."""
from __future__ import annotations

import pytest

from _support.adapter_testlib import PRELUDE, active, fresh_runner  # noqa: F401  (active: a fixture for the tests)

TRANSFORMERS_PRELUDE = '''

def all_mapped(module):
    tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.numel()]
    return bool(tensors) and all(overmind_mapped(t.data_ptr()) for t in tensors)
'''


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Folders of the tiny models (see tests/_support/tiny_models.py), built once per session."""
    from _support import tiny_models as tm

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
    """``fresh(script, **env)``: run ``script`` after the shared prelude and :data:`TRANSFORMERS_PRELUDE` in a
    new interpreter against this test's server; see ``_support.adapter_testlib.fresh_runner``."""
    return fresh_runner(PRELUDE + TRANSFORMERS_PRELUDE, tiny, tmp_path)
