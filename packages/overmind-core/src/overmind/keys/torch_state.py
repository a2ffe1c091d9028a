"""The process-wide torch state that changes what a plain loader returns (default dtype and device, inference mode,
replaced registration methods and tensor constructors): part of every cache key.

Two calls with equal arguments can still have different plain results:

* torch's **default dtype** and **default device** (``torch.set_default_dtype``, ``torch.set_default_device``,
  ``with torch.device("meta"):``) decide what ``torch.zeros(2)`` inside a loader makes, and transformers loads a
  model in the default dtype when no ``torch_dtype`` is given;
* **inference mode** (``with torch.inference_mode():``) makes every tensor a loader creates an inference tensor;
* **patched registration and tensor constructors**: ``accelerate.init_empty_weights()`` / ``init_on_device()``
  replace ``nn.Module.register_parameter`` (and ``register_buffer``, or ``torch.empty``/``zeros``/``ones``/
  ``full`` in older releases) with functions that move every new parameter to ``meta`` or another device. Where
  one of these is not torch's own, the replacement is described as any function value is (its code or version,
  and its closure cells: the device), so a load inside the context and one outside it are two entries.

:func:`key_part` is that state, read now: it is part of every key (two states, two entries). While torch is not
imported nothing can have set it, and a loader that imports torch starts from torch's defaults: the key part is
then those defaults, so a call keys alike before and after the user's ``import torch``.

Not here: the global random generators. A call that draws from them is varied by their states
(``loading/randomness.py``).
"""
from __future__ import annotations

import sys

DEFAULTS = ("torch.float32", "cpu", False, ())

_REGISTRATION = ("register_parameter", "register_buffer", "register_module")  # of torch.nn.Module
_CONSTRUCTORS = ("empty", "zeros", "ones", "full")  # of torch (C functions unless patched)


def key_part() -> tuple:
    """``(default dtype, default device, inference mode, patches)`` of torch now (:data:`DEFAULTS` before its
    import); ``patches`` describes each registration method or tensor constructor that is not torch's own."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "is_inference_mode_enabled"):  # not imported, or halfway through it
        return DEFAULTS
    get_device = getattr(torch, "get_default_device", None)  # torch >= 2.3
    return (str(torch.get_default_dtype()), str(get_device()) if get_device else None,
            bool(torch.is_inference_mode_enabled()), _patches(torch))


def makes_meta(part: tuple) -> bool:
    """Whether a call made in state ``part`` (a :func:`key_part`) was made to produce tensors that are not on their
    usual device: a ``meta`` default device, or patched registration (``init_empty_weights``)."""
    return part[1] == "meta" or bool(part[3])


_pristine: tuple = ()  # the registration methods and constructors last seen all torch's own


def _patches(torch) -> tuple:
    global _pristine
    module = getattr(getattr(torch, "nn", None), "Module", None)
    if module is None:  # torch halfway through its import
        return ()
    current = tuple(module.__dict__.get(name) for name in _REGISTRATION) + \
        tuple(getattr(torch, name, None) for name in _CONSTRUCTORS)
    if current == _pristine:  # compared by identity: the common case costs a tuple
        return ()
    found = []
    for name, fn in zip(_REGISTRATION, current):
        if getattr(fn, "__qualname__", None) != f"Module.{name}" or fn.__module__ != "torch.nn.modules.module":
            found.append(("Module." + name, fn))
    for name, fn in zip(_CONSTRUCTORS, current[len(_REGISTRATION):]):
        if type(fn).__name__ != "builtin_function_or_method":
            found.append(("torch." + name, fn))
    if not found:
        _pristine = current
        return ()
    from .canon import canon  # only where something is patched: the key walk imported it already

    return tuple((where, canon(fn)) for where, fn in found)
