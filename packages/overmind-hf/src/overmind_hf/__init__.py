"""What the Overmind adapters for Hugging Face libraries share (overmind-transformers, overmind-diffusers).

Both libraries resolve Hub ids through the same cache, import remote code under a prefix of their own,
dispatch with accelerate and take the same aliases; one plugin body serves them both:

- :mod:`overmind_hf.adapter`: :class:`~overmind_hf.adapter.HubAdapter`, the hooks both adapters have in common;
- :mod:`overmind_hf.arguments`: ``torch_dtype`` / ``dtype`` folding, the positional path, fetch-only arguments;
- :mod:`overmind_hf.hub`: the resolved Hub revision as a key part;
- :mod:`overmind_hf.dynamic_modules`: remote code recorded with an entry, importable before unpickling;
- :mod:`overmind_hf.dispatch`: the accelerate rule (a dispatched result is refused unless an adapter carries
  its hooks; overmind-bnb does, for quantized models).

This package is no adapter itself (it has no entry point) and imports no library at import time.
"""
__version__ = "0.1.0"
