"""Fixtures for the overmind-sfast tests: a tiny SD pipeline saved once per session, stable-fast patched on demand.

Every test runs on the CPU with the CPU build of stable-fast (scripts/setup installs it from ../shared/wheels);
tests that need stable-fast skip themselves when it is not installed, the one that checks that case does not.
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sd_ckpt(tmp_path_factory) -> Path:
    """A tiny SD1.5-architecture pipeline folder (tests/_support/tiny_models.py)."""
    from _support.tiny_models import build_sd_pipeline

    return build_sd_pipeline(tmp_path_factory.mktemp("sd") / "ckpt")


@pytest.fixture
def sfast_patched():
    """overmind-sfast's stable-fast patches applied for one test (as activate() does), restored after."""
    from overmind.adapter import patch_now
    from overmind.testing import unpatch
    from overmind_sfast import plugin

    targets = plugin.patch_targets()
    for t in targets:
        patch_now(t)
    try:
        yield targets
    finally:
        for t in reversed(targets):
            unpatch(t)


@pytest.fixture
def table():
    """The pickler's reducer table as load() builds it for this adapter: core TorchScript + overmind-sfast."""
    import torch

    from overmind.adapter import reduce_script_module
    from overmind_sfast.reducers import reducers

    return {torch.jit.ScriptModule: reduce_script_module, **reducers()}
