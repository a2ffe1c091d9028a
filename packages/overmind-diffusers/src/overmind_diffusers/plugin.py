"""The diffusers adapter: :data:`adapter`, the object the ``overmind.adapters`` entry point names,
whose hooks ``overmind.activate()`` registers.

Patched (each with the imported subclasses that override it; see :func:`overmind.adapter.collect`):
``DiffusionPipeline.from_pretrained``, the four AutoPipeline classes, ``ModelMixin.from_pretrained``
(``LegacyModelMixin``, ``MultiControlNetModel``, ``MultiAdapter`` override it), ``FromSingleFileMixin`` and
``FromOriginalModelMixin.from_single_file``, ``SchedulerMixin.from_pretrained`` and diffusers' ``AutoModel``.
A pipeline loads its components through these same class methods, so each component is its own entry and the
pipeline's entry references their weights.

This module declares what is diffusers' own; the hooks, which both Hugging Face adapters share, are
:class:`overmind_hf.adapter.HubAdapter`'s.
"""
from __future__ import annotations

from overmind.adapter import Spec
from overmind_hf.adapter import HubAdapter

from . import self_check_sample as _sample
from . import values
from .arguments import normalise

ADAPTER = "diffusers"
SPECS = (
    Spec("diffusers.pipelines.pipeline_utils:DiffusionPipeline", lazy=True),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForText2Image", lazy=True),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForImage2Image", lazy=True),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForInpainting", lazy=True),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForText2Audio", lazy=True),
    Spec("diffusers.models.modeling_utils:ModelMixin", lazy=True),
    Spec("diffusers.models.controlnets.multicontrolnet:MultiControlNetModel", lazy=True),
    Spec("diffusers.models.controlnets.multicontrolnet_union:MultiControlNetUnionModel", lazy=True),
    Spec("diffusers.models.adapter:MultiAdapter", lazy=True),
    Spec("diffusers.models.auto_model:AutoModel", lazy=True),
    Spec("diffusers.loaders.single_file:FromSingleFileMixin", "from_single_file", lazy=True),
    Spec("diffusers.loaders.single_file_model:FromOriginalModelMixin", "from_single_file", lazy=True),
    Spec("diffusers.schedulers.scheduling_utils:SchedulerMixin", lazy=True),
)
# Each loader is patched when its module is imported (lazy), however diffusers' lazy imports reach it: a class
# cannot be called before its module is imported, and ``import diffusers`` imports none of them. Importing them for
# the patch would cost every process that imports diffusers what it never uses: ``pipeline_utils`` imports every
# autoencoder (with transformers' vision models, 0.3 s), ``auto_pipeline`` every pipeline (0.7 s and 21 MiB), the
# multi-ControlNet modules every ControlNet. The multi-model classes override ModelMixin.from_pretrained.
DYNAMIC_MODULES = "diffusers_modules"  # custom pipelines and components
key_for_value = values.key_for_value  # schedulers by config; hand-built MultiControlNetModels by their nets
self_check_sample = _sample.sample  # a one-block UNet and a scheduler, built from their configs
__all__ = ["ADAPTER", "SPECS", "DYNAMIC_MODULES", "normalise", "key_for_value",
           "self_check_sample", "adapter"]

adapter = HubAdapter(__name__)
