"""Overmind adapter for mylib.

After ``overmind.activate()``, ``mylib.Model.from_pretrained`` (and the subclasses that override it)
and ``mylib.create_model`` go through ``overmind.load``: the first load on the machine publishes the
model, later loads in any process map it. The adapter is ``overmind_mylib.plugin:adapter``, the
object its entry point names.
"""
__version__ = "0.1.0"
