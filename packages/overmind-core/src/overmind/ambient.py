"""The process-wide torch state that changes what a plain loader returns: part of every cache key.

Two calls with equal arguments can still have different plain results:

* torch's **default dtype** and **default device** (``torch.set_default_dtype``, ``torch.set_default_device``,
  ``with torch.device("meta"):``) decide what ``torch.zeros(2)`` inside a loader makes, and transformers loads a
  model in the default dtype when no ``torch_dtype`` is given;
* **inference mode** (``with torch.inference_mode():``) makes every tensor a loader creates an inference tensor.

:func:`key_part` is that state, read now: it is part of every key (two states, two entries). While torch is not
imported nothing can have set it, and a loader that imports torch starts from torch's defaults: the key part is
then those defaults, so a call keys alike before and after the user's ``import torch``.

Not here: the global random generators. A loader that draws from them is not cached at all (``randomness.py``).
"""
from __future__ import annotations

import sys

DEFAULTS = ("torch.float32", "cpu", False)


def key_part() -> tuple:
    """``(default dtype, default device, inference mode)`` of torch now (:data:`DEFAULTS` before its import)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "is_inference_mode_enabled"):  # not imported, or halfway through it
        return DEFAULTS
    get_device = getattr(torch, "get_default_device", None)  # torch >= 2.3
    return (str(torch.get_default_dtype()), str(get_device()) if get_device else None,
            bool(torch.is_inference_mode_enabled()))
