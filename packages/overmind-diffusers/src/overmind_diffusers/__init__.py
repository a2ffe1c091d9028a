"""Overmind adapter for Hugging Face diffusers.

After ``overmind.activate()``, pipelines (``DiffusionPipeline`` and the AutoPipeline classes), models
(``ModelMixin`` and the subclasses that override ``from_pretrained``), both ``from_single_file`` mixins and
schedulers load through ``overmind.load``. The components a pipeline loads inside its own ``from_pretrained``
go through the patched class methods too, so a component shared by two pipelines is stored once, and a
component passed in (``vae=vae``) is referenced by the pipeline's entry, not copied.

The adapter is ``overmind_diffusers.plugin:adapter``, the object its entry point names; its Hub,
remote-code, dispatch and argument helpers are shared with ``overmind-transformers`` through
``overmind-hf`` (:mod:`overmind_hf`).
"""
__version__ = "0.1.0"
