"""Overmind adapter for Hugging Face transformers.

After ``overmind.activate()``, ``from_pretrained`` of every model (``PreTrainedModel`` and the subclasses that
override it), the Auto classes, tokenizers, processors, image processors and feature extractors goes through
``overmind.load``: the first load on the machine publishes the object, later loads in any process map it.

The adapter is ``overmind_transformers.plugin:adapter``, the object its entry point names. What it
shares with ``overmind-diffusers`` (both libraries load from the same Hub cache, import remote code and
dispatch with accelerate the same way) is in ``overmind-hf`` (:mod:`overmind_hf`).
"""
__version__ = "0.1.0"
