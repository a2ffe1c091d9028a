"""Overmind adapter for Hugging Face transformers.

After ``overmind.activate()``, ``from_pretrained`` of every model (``PreTrainedModel`` and the subclasses that
override it), the Auto classes, tokenizers, processors, image processors and feature extractors goes through
``overmind.load``: the first load on the machine publishes the object, later loads in any process map it.

The plugin is :mod:`overmind_transformers.plugin`. A few modules here are shared with ``overmind-diffusers``
(both libraries load from the same Hub cache and import remote code the same way): :mod:`.support`,
:mod:`.targets`, :mod:`.hub`, :mod:`.dynamic_modules` and :mod:`.dispatch`.
"""
__version__ = "0.1.0"
