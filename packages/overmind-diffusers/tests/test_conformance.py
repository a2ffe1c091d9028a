"""The adapter API contract for diffusers: targets resolve, activate/deactivate are symmetric, a target that
exists but cannot be patched warns with the adapter, the target and the versions, one this diffusers does not
define is skipped quietly."""
from __future__ import annotations

import warnings

import pytest

import overmind
from overmind import OvermindWarning
from overmind.testing import check_patch_symmetry, check_targets_resolve


def test_targets_resolve():
    described = {t.describe() for t in check_targets_resolve("diffusers")}
    for expected in ("diffusers.pipelines.pipeline_utils.DiffusionPipeline.from_pretrained",
                     "diffusers.pipelines.auto_pipeline.AutoPipelineForText2Image.from_pretrained",
                     "diffusers.pipelines.auto_pipeline.AutoPipelineForImage2Image.from_pretrained",
                     "diffusers.pipelines.auto_pipeline.AutoPipelineForInpainting.from_pretrained",
                     "diffusers.models.modeling_utils.ModelMixin.from_pretrained",
                     "diffusers.models.controlnets.multicontrolnet.MultiControlNetModel.from_pretrained",
                     "diffusers.loaders.single_file.FromSingleFileMixin.from_single_file",
                     "diffusers.loaders.single_file_model.FromOriginalModelMixin.from_single_file",
                     "diffusers.schedulers.scheduling_utils.SchedulerMixin.from_pretrained"):
        assert expected in described


def test_patch_symmetry():
    check_patch_symmetry("diffusers")


def test_deactivate_restores_the_identical_objects():
    import diffusers
    from diffusers.loaders.single_file import FromSingleFileMixin

    owners = [(diffusers.DiffusionPipeline, "from_pretrained"), (diffusers.ModelMixin, "from_pretrained"),
              (diffusers.SchedulerMixin, "from_pretrained"), (FromSingleFileMixin, "from_single_file"),
              (diffusers.AutoPipelineForText2Image, "from_pretrained")]
    before = [vars(o)[n] for o, n in owners]
    overmind.activate()
    try:
        assert all(vars(o)[n] is not b for (o, n), b in zip(owners, before))
    finally:
        overmind.deactivate()
    assert all(vars(o)[n] is b for (o, n), b in zip(owners, before))
    assert "from_pretrained" not in vars(diffusers.UNet2DConditionModel)


def test_a_target_that_cannot_be_patched_warns_with_adapter_target_and_versions(monkeypatch):
    import diffusers

    from overmind.adapter import Spec
    from overmind_diffusers import plugin

    monkeypatch.setattr(plugin, "SPECS", plugin.SPECS + (
        Spec("diffusers.pipelines.pipeline_utils:PipelineOfAnotherVersion"),  # not defined here: skipped quietly
        Spec("diffusers.pipelines.pipeline_utils:DiffusionPipeline", "save_pretrained")))  # no classmethod: warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        targets = plugin.adapter.overmind_patch_targets()
    [message] = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    assert "adapter diffusers (overmind-diffusers 0.1.0, diffusers " + diffusers.__version__ in message
    assert "DiffusionPipeline.save_pretrained" in message and "not a classmethod" in message
    assert any(t.owner is diffusers.DiffusionPipeline for t in targets)


@pytest.fixture(autouse=True)
def _always_deactivated():
    yield
    overmind.deactivate()
