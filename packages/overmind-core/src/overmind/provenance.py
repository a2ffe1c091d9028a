"""Provenance: an object returned by an earlier load is keyed by that entry while it provably still is it.

``vae = AutoencoderKL.from_pretrained(...)`` then ``Pipeline.from_pretrained(..., vae=vae)``: hashing the
vae's weights on every call would cost as much as loading them, so a module or tensor rebuilt from entry
``E`` is keyed as ``("entry", E)``, but only while it is exactly what the rebuild produced:

- the same tensors at the same places (``vae.decoder.conv.weight`` is still the tensor that was there, not
  one swapped in from elsewhere), each in its original mapping with its original dtype, shape, stride,
  offset, class, device and ``requires_grad``, and its pages untouched since the mapping was made
  (``/proc/self/pagemap``: a private copy-on-write page means it was written);
- the same module tree (class and ``training`` flag of every submodule);
- for a module with a ``config``, the same config content (as the function the rebuild passed to
  :func:`remember_origin` describes it: the key's own description, so this module imports no key code).

``vae.half()``, ``vae.to("cuda")``, ``p.data.add_(1)``, a replaced parameter, ``vae.train()`` or an edited
config all end that: the object is then keyed by content, or not at all. Only modules and tensors are
tracked; any other result (a tokenizer, a pipeline) is keyed by its content every time.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable

from .errors import Unkeyable

_lock = threading.Lock()
_origins: dict[int, tuple[weakref.ref, str, Any, Callable[[Any], Any]]] = {}


class _Changed(Exception):
    pass


def _tensor_row(t: Any) -> tuple:
    s = t.untyped_storage()
    return (type(t), s.device.type, s.data_ptr(), s.nbytes(), t.dtype, tuple(t.shape), t.stride(),
            t.storage_offset(), t.requires_grad, t.is_conj(), t.is_neg(), str(t.device))


def snapshot(obj: Any, describe_config: Callable[[Any], Any]) -> Any:
    """What :func:`origin_of` compares against later; ``None`` if ``obj`` is not tracked.

    A module's snapshot lists, module by module in tree order, the class, ``training``, hook counts, child
    names, and every parameter, buffer and tensor attribute (by name, object and :func:`_tensor_row`). It
    reads the module dicts directly: this runs for every module a load returns (~10 us per module).
    ``describe_config(config)`` gives a module's config in comparable form, or raises ``Unkeyable``.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        return ("tensor", _tensor_row(obj), getattr(obj, "_grad", None) is None, bool(obj.__dict__))
    if not isinstance(obj, torch.nn.Module):
        return None
    tensor_type = torch.Tensor
    rows = []
    for m in obj.modules():
        d = m.__dict__
        params = tuple((k, id(v), _tensor_row(v), v.grad is None) for k, v in d["_parameters"].items() if v is not None)
        buffers = tuple((k, id(v), _tensor_row(v)) for k, v in d["_buffers"].items() if v is not None)
        loose = tuple((k, id(v), _tensor_row(v)) for k, v in d.items() if isinstance(v, tensor_type))
        rows.append((type(m), m.training, tuple(d["_modules"]), len(d["_forward_hooks"]),
                     len(d["_forward_pre_hooks"]), params, buffers, loose))
    return ("module", tuple(rows), _config_form(obj, describe_config))


def _config_form(module: Any, describe_config: Callable[[Any], Any]) -> Any:
    config = getattr(module, "config", None)
    if config is None:
        return None
    try:
        return describe_config(config)
    except Unkeyable:
        return _Unknown  # compared by identity below: an undescribable config never matches


class _UnknownType:
    def __eq__(self, other):
        return False

    def __repr__(self):
        return "<config not describable>"


_Unknown = _UnknownType()


def _ranges(shot: Any) -> list[tuple[int, int]]:
    """The (address, nbytes) of every CPU storage a snapshot lists."""
    if shot[0] == "tensor":
        rows = [shot[1]]
    else:
        rows = [t[2] for module in shot[1] for group in module[5:8] for t in group]
    return [(row[2], row[3]) for row in rows]  # a storage off the CPU is in no mapping: not pristine


def _still_mapped(shot: Any) -> bool:
    """Every tensor's storage lies in a live entry mapping and its pages are untouched."""
    from .shm import mappings

    ranges = [(p, n) for p, n in _ranges(shot) if n]
    if not all(mappings.contains(p) for p, _ in ranges):
        return False  # moved to a GPU, converted, or replaced by a tensor from elsewhere
    return mappings.all_pristine(ranges)


def remember_origin(obj: Any, key: str, describe_config: Callable[[Any], Any]) -> None:
    """Record that ``obj`` was just rebuilt from the entry with ``key``. Other objects are not tracked.
    ``describe_config`` describes a module's config, now and in every later :func:`origin_of` check."""
    shot = snapshot(obj, describe_config)
    if shot is None:
        return
    try:
        ref = weakref.ref(obj, functools.partial(_forget, id(obj)))
    except TypeError:
        return
    with _lock:
        _origins[id(obj)] = (ref, key, shot, describe_config)


def _forget(ident: int, ref) -> None:
    with _lock:
        if ident in _origins and _origins[ident][0] is ref:
            del _origins[ident]


def origin_of(obj: Any) -> str | None:
    """The key of the entry ``obj`` still provably is, else ``None`` (then it is keyed by content)."""
    with _lock:
        rec = _origins.get(id(obj))
    if rec is None or rec[0]() is not obj:
        return None
    _, key, shot, describe_config = rec
    try:
        if snapshot(obj, describe_config) != shot or not _still_mapped(shot):
            raise _Changed
    except _Changed:
        return None
    return key


__all__ = ["remember_origin", "origin_of", "snapshot"]
