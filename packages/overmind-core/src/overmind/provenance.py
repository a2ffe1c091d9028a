"""Provenance: an object returned by an earlier load is keyed by that entry while it provably still is it.

``vae = AutoencoderKL.from_pretrained(...)`` then ``Pipeline.from_pretrained(..., vae=vae)``: hashing the
vae's weights on every call would cost as much as loading them, so a module or tensor rebuilt from entry
``E`` is keyed as ``("entry", E)``, but only while it is exactly what the rebuild produced:

- the same tensors at the same places (``vae.decoder.conv.weight`` is still the tensor that was there, not
  one swapped in from elsewhere), each in its original mapping with its original dtype, shape, stride,
  offset, class, device and ``requires_grad``, and its pages untouched since the mapping was made
  (``/proc/self/pagemap``: a private copy-on-write page means it was written);
- the same module tree (class and ``training`` flag of every submodule);
- for a module with a ``config``, the same config content.

``vae.half()``, ``vae.to("cuda")``, ``p.data.add_(1)``, a replaced parameter, ``vae.train()`` or an edited
config all end that: the object is then keyed by content, or not at all. Only modules and tensors are
tracked; any other result (a tokenizer, a pipeline) is keyed by its content every time.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_lock = threading.Lock()
_origins: dict[int, tuple[weakref.ref, str, Any]] = {}


class _Changed(Exception):
    pass


def _tensor_row(t: Any) -> tuple:
    s = t.untyped_storage()
    return (type(t), s.device.type, s.data_ptr(), s.nbytes(), t.dtype, tuple(t.shape), t.stride(),
            t.storage_offset(), t.requires_grad, t.is_conj(), t.is_neg(), str(t.device))


def snapshot(obj: Any) -> Any:
    """What :func:`origin_of` compares against later; ``None`` if ``obj`` is not tracked."""
    import torch

    if isinstance(obj, torch.Tensor):
        return ("tensor", _tensor_row(obj), getattr(obj, "_grad", None) is None, bool(obj.__dict__))
    if not isinstance(obj, torch.nn.Module):
        return None
    tensors = []
    for name, t in obj.named_parameters(remove_duplicate=False):
        tensors.append((name, _tensor_row(t), t.grad is None))
    for name, t in obj.named_buffers(remove_duplicate=False):
        tensors.append((name, _tensor_row(t)))
    tree = []
    for name, m in obj.named_modules(remove_duplicate=False):
        loose = tuple((k, _tensor_row(v)) for k, v in m.__dict__.items() if isinstance(v, torch.Tensor))
        tree.append((name, type(m), m.training, loose, len(m._forward_hooks), len(m._forward_pre_hooks)))
    return ("module", tuple(tensors), tuple(tree), _config_form(obj))


def _config_form(module: Any) -> Any:
    config = getattr(module, "config", None)
    if config is None:
        return None
    from . import canon, plugins

    try:
        return repr(canon.canon(config, lambda v: plugins.first_result("overmind_key_for_value", value=v)))
    except canon.Unkeyable:
        return _Unknown  # compared by identity below: an undescribable config never matches


class _UnknownType:
    def __eq__(self, other):
        return False

    def __repr__(self):
        return "<config not describable>"


_Unknown = _UnknownType()


def _ranges(obj: Any) -> list[tuple[int, int]]:
    import torch

    if isinstance(obj, torch.Tensor):
        tensors = [obj]
    else:
        tensors = [t for _, t in obj.named_parameters(remove_duplicate=False)]
        tensors += [t for _, t in obj.named_buffers(remove_duplicate=False)]
        tensors += [v for m in obj.modules() for v in m.__dict__.values() if isinstance(v, torch.Tensor)]
    return [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors]


def _still_mapped(obj: Any) -> bool:
    """Every tensor's storage lies in a live entry mapping and its pages are untouched."""
    from .shm import mappings

    ranges = [(p, n) for p, n in _ranges(obj) if n]
    if not all(mappings.contains(p) for p, _ in ranges):
        return False  # moved to a GPU, converted, or replaced by a tensor from elsewhere
    return mappings.all_pristine(ranges)


def remember_origin(obj: Any, key: str) -> None:
    """Record that ``obj`` was just rebuilt from the entry with ``key``. Other objects are not tracked."""
    shot = snapshot(obj)
    if shot is None:
        return
    try:
        ref = weakref.ref(obj, lambda _r, i=id(obj): _forget(i, _r))
    except TypeError:
        return
    with _lock:
        _origins[id(obj)] = (ref, key, shot)


def _forget(ident: int, ref) -> None:
    with _lock:
        if ident in _origins and _origins[ident][0] is ref:
            del _origins[ident]


def forget(obj: Any) -> None:
    """Stop treating ``obj`` as an entry's object (e.g. after its entry was found corrupt)."""
    with _lock:
        _origins.pop(id(obj), None)


def origin_of(obj: Any) -> str | None:
    """The key of the entry ``obj`` still provably is, else ``None`` (then it is keyed by content)."""
    with _lock:
        rec = _origins.get(id(obj))
    if rec is None or rec[0]() is not obj:
        return None
    _, key, shot = rec
    try:
        if snapshot(obj) != shot or not _still_mapped(obj):
            raise _Changed
    except _Changed:
        return None
    return key


def tracked_count() -> int:
    with _lock:
        return len(_origins)


__all__ = ["remember_origin", "origin_of", "forget", "snapshot", "tracked_count"]
