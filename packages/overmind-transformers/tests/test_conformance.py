"""The adapter API contract: targets resolve, activate/deactivate are symmetric, a target that cannot be patched
warns (one this transformers does not define is skipped quietly)."""
from __future__ import annotations

import warnings

import pytest

import overmind
from overmind import OvermindWarning
from overmind.adapter import is_patched
from overmind.testing import check_patch_symmetry, check_targets_resolve


def test_targets_resolve():
    described = {t.describe() for t in check_targets_resolve("transformers")}
    for expected in ("transformers.modeling_utils.PreTrainedModel.from_pretrained",
                     "transformers.models.auto.modeling_auto.AutoModelForCausalLM.from_pretrained",
                     "transformers.models.auto.tokenization_auto.AutoTokenizer.from_pretrained",
                     "transformers.models.auto.processing_auto.AutoProcessor.from_pretrained",
                     "transformers.models.auto.image_processing_auto.AutoImageProcessor.from_pretrained",
                     "transformers.models.auto.feature_extraction_auto.AutoFeatureExtractor.from_pretrained",
                     "transformers.tokenization_utils_base.PreTrainedTokenizerBase.from_pretrained",
                     "transformers.processing_utils.ProcessorMixin.from_pretrained"):
        assert expected in described


def test_patch_symmetry():
    check_patch_symmetry("transformers")


def test_deactivate_restores_the_identical_objects():
    import transformers

    owners = [transformers.PreTrainedModel, transformers.AutoModel, transformers.AutoModelForCausalLM,
              transformers.AutoTokenizer, transformers.PreTrainedTokenizerBase, transformers.ProcessorMixin]
    before = [vars(o)["from_pretrained"] for o in owners]
    overmind.activate()
    try:
        assert all(vars(o)["from_pretrained"] is not b for o, b in zip(owners, before))
    finally:
        overmind.deactivate()
    assert all(vars(o)["from_pretrained"] is b for o, b in zip(owners, before))
    assert "from_pretrained" not in vars(transformers.BertModel)  # inherited before: nothing left behind


def test_subclass_overriding_from_pretrained_is_patched_too():
    import transformers

    class OverridingModel(transformers.BertModel):
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            return super().from_pretrained(*args, **kwargs)

    from overmind_transformers import plugin

    targets = {(t.owner, t.name) for t in plugin.adapter.overmind_patch_targets()}
    assert (OverridingModel, "from_pretrained") in targets
    assert (transformers.BertModel, "from_pretrained") not in targets  # inherits it: the base patch covers it


def test_a_target_that_cannot_be_patched_warns_with_adapter_target_and_versions(monkeypatch):
    from overmind.adapter import Spec
    from overmind_transformers import plugin

    monkeypatch.setattr(plugin, "SPECS", plugin.SPECS + (
        Spec("transformers.modeling_utils:PreTrainedModelThatMoved"),
        Spec("transformers.models.auto.tokenization_auto:AutoTokenizer", "register"),
    ))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        targets = plugin.adapter.overmind_patch_targets()
    messages = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    import transformers

    version = f"transformers {transformers.__version__}"
    assert not [m for m in messages if "PreTrainedModelThatMoved" in m]  # not in this version: a debug line only
    not_classmethod = [m for m in messages if "AutoTokenizer.register" in m]
    assert not_classmethod and "not a classmethod" in not_classmethod[0] and version in not_classmethod[0]
    # The rest still patches.
    assert any(t.owner is transformers.PreTrainedModel for t in targets)
    assert not any(is_patched(t.owner, t.name) for t in targets)


@pytest.fixture(autouse=True)
def _always_deactivated():
    yield
    overmind.deactivate()
