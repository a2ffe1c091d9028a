"""overmind-mylib against the conformance checks of ``overmind.testing``, the kit's pytest plugin
(its ``overmind_runtime`` fixture gives a test a private server): each loader exists, has the kind
declared and takes what the key hook reads; ``activate()`` patches each once and ``deactivate()``
puts the originals back; no loader of another adapter is patched."""
from __future__ import annotations

import pytest

from overmind.testing import check_claims_only_its_own, check_patch_symmetry, check_targets_resolve

pytest.importorskip("mylib", reason="mylib, the library this adapter instruments, is not installed")

ADAPTER = "mylib"  # the entry point's name


def test_every_loader_resolves_and_takes_what_the_key_reads(overmind_runtime):
    # less a loader lacking a parameter the self-check's relies_on names (left plain)
    targets = check_targets_resolve(ADAPTER)
    assert {t.name for t in targets} == {"from_pretrained", "create_model"}


def test_activate_patches_once_and_deactivate_restores_by_identity(overmind_runtime):
    check_patch_symmetry(ADAPTER)


def test_it_patches_no_loader_of_another_adapter(overmind_runtime):
    check_claims_only_its_own(ADAPTER)
