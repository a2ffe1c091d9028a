"""Canonical forms of torch values (see :mod:`overmind.keys.canon`); imported only once a torch value is met and,
handed the walk, never importing ``canon``."""
from __future__ import annotations

import ctypes
import hashlib
from typing import Any

import torch

from ..errors import Unkeyable

_ENUM_LIKE = (torch.dtype, torch.device, torch.memory_format, torch.layout, torch.qscheme)


def describe(walk, v: Any, depth: int) -> Any:
    """``v``'s canonical form; ``walk`` is the :class:`overmind.keys.canon.Walk` that met it (passed in, not
    imported)."""
    if isinstance(v, _ENUM_LIKE):
        return ("torch", type(v).__name__, str(v))
    if isinstance(v, torch.Size):
        return ("size", tuple(int(x) for x in v))
    if isinstance(v, torch.Tensor):
        return tensor(walk, v, depth)
    if isinstance(v, torch.Generator):
        raise Unkeyable("a torch.Generator argument changes as the loader draws from it; not cached")
    return walk.instance(v, type(v), depth)


def tensor(walk, t: torch.Tensor, depth: int) -> Any:
    """Everything a loader can read from ``t``: class, layout, view, flags, grad, attributes, bytes."""
    if t.layout is not torch.strided or t.is_quantized or t.is_nested:
        raise Unkeyable(f"a {t.layout} tensor argument (quantized={t.is_quantized}) cannot be keyed by content")
    storage = t.untyped_storage()
    device = storage.device
    ident = (str(device), storage.data_ptr(), storage.nbytes())
    index = walk.storages.get(ident)
    if index is None:
        index = walk.storages[ident] = len(walk.storages)
        content = _storage_digest(walk, storage)
    else:
        content = ("same-storage",)
    names = getattr(t, "names", None)
    names = tuple(names) if names and any(n is not None for n in names) else None
    view = (str(t.dtype), tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.device))
    flags = (t.requires_grad, t.is_conj(), t.is_neg(), t.is_leaf, names)
    grad = getattr(t, "_grad", None)  # .grad warns on non-leaf tensors; _grad reads the same slot quietly
    attrs = walk.value(dict(t.__dict__), depth) if t.__dict__ else None
    return ("tensor", walk.type_id(type(t), depth), view, flags, ("storage", index, storage.nbytes(), content),
            walk.value(grad, depth) if grad is not None else None, attrs)


def _storage_digest(walk, storage: torch.UntypedStorage) -> Any:
    nbytes = storage.nbytes()
    if storage.device.type == "meta":
        return ("meta",)
    walk.tensor_bytes += nbytes
    if walk.tensor_bytes > walk.max_tensor_bytes:
        raise Unkeyable(f"tensor arguments of more than {walk.max_tensor_bytes >> 20} MiB are too large to key by "
                        f"content (pass a tensor returned by an earlier load, or keep it out of the call)")
    if storage.device.type != "cpu":
        storage = storage.cpu()
    data = ctypes.string_at(storage.data_ptr(), nbytes) if nbytes else b""
    return hashlib.sha256(data).hexdigest()
