"""Fixtures for the overmind-bnb tests: tiny quantizable models saved once per session (overmind_bnb_testlib.py).

Every test runs on the CPU with bitsandbytes' CPU backend; none needs a GPU (benchmarks/gpu/bnb_gpu_check.py covers one).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("bitsandbytes")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def llama_path(tmp_path_factory) -> Path:
    """A tiny Llama (hidden 64, untied) saved with save_pretrained."""
    from overmind_bnb_testlib import build_bnb_llama

    return build_bnb_llama(tmp_path_factory.mktemp("bnb-llama"))


@pytest.fixture(scope="session")
def tied_llama_path(tmp_path_factory) -> Path:
    """The same tiny Llama with tied input/output embeddings."""
    from overmind_bnb_testlib import build_bnb_llama

    return build_bnb_llama(tmp_path_factory.mktemp("bnb-llama-tied"), tie_word_embeddings=True)
