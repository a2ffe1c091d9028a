"""Copies of a hit's weights to a GPU, read from the pinned twins of :mod:`.twins`: ``torch.nn.Module.to`` and
``.cuda`` (replaced while a twin lives) point a module's pristine plain tensors at their twins for the call, and a
cached GPU load's storages are restored from their twins.

Two copies go through here:

* ``module.to("cuda")`` / ``module.cuda()`` (``torch.nn.Module``'s own methods, replaced while a twin exists
  in this process and restored by :func:`uninstall`). Before torch's own method runs, each plain tensor of the
  module (a ``Tensor`` or ``Parameter``, not a subclass) whose storage has a pristine twin is pointed at the
  twin's storage: same bytes, same offset, size, strides and version counter. torch's method then copies from
  pinned memory. Afterwards every tensor still on the CPU (a buffer the module replaced, a failed call) gets its
  own storage back, so no object of the user's keeps a twin's read-only pages.
* a cached GPU load (``device_map="cuda"``): :func:`to_device` copies each storage the entry recorded on a GPU
  from its twin.

Everything else (a tensor subclass, a storage with a written page, a twin the driver refused, a copy that is not
to a CUDA device) is left to torch as it is, so the values are the plain copy's in every case.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from .._util import interrupts
from . import twins

_set_versions = torch._C._autograd._unsafe_set_version_counter
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_install_lock = threading.Lock()
_originals: dict[str, Any] = {}  # what install() replaced
_TORCH_TO, _TORCH_CUDA = torch.nn.Module.to, torch.nn.Module.cuda


def install() -> None:
    """Replace ``torch.nn.Module.to`` and ``.cuda`` (once; :func:`uninstall` puts torch's back)."""
    with _install_lock:
        if _originals:
            return
        module = torch.nn.Module
        _originals["to"], _originals["cuda"] = module.to, module.cuda
        module.to = _to  # type: ignore[method-assign]
        module.cuda = _cuda  # type: ignore[method-assign]


def uninstall() -> None:
    with _install_lock:
        if not _originals:
            return
        module = torch.nn.Module
        if module.to is _to:
            module.to = _originals["to"]  # type: ignore[method-assign]
        if module.cuda is _cuda:
            module.cuda = _originals["cuda"]  # type: ignore[method-assign]
        _originals.clear()


def installed() -> bool:
    return bool(_originals)


def _to(self, *args, **kwargs):
    original = _originals.get("to", _TORCH_TO)
    if not twins.any_live() or not _to_cuda(args, kwargs):
        return original(self, *args, **kwargs)
    with _reading_twins(self):
        return original(self, *args, **kwargs)


def _cuda(self, device=None):
    original = _originals.get("cuda", _TORCH_CUDA)
    if not twins.any_live():
        return original(self, device)
    with _reading_twins(self):
        return original(self, device)


_to.__doc__, _to.__name__, _to.__qualname__ = torch.nn.Module.to.__doc__, "to", "Module.to"
_cuda.__doc__, _cuda.__name__, _cuda.__qualname__ = torch.nn.Module.cuda.__doc__, "cuda", "Module.cuda"


def _to_cuda(args: tuple, kwargs: dict) -> bool:
    try:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
    except Exception as exc:  # torch's own method raises the same error for the user
        interrupts.raise_users(exc)
        return False
    return device is not None and device.type == "cuda"


class _reading_twins:
    """Point a module's plain CPU tensors at their twins' storages for the duration of a ``with``."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.swapped: list[tuple[torch.Tensor, torch.UntypedStorage, int, int]] = []

    def __enter__(self) -> None:
        tensors: dict[int, torch.Tensor] = {}
        for m in self.module.modules():
            for t in itertools.chain(m._parameters.values(), m._buffers.values()):
                if (t is not None and type(t) in _PLAIN and t.device.type == "cpu" and t.layout is torch.strided
                        and not t.is_inference()):
                    tensors.setdefault(id(t), t)
        if not tensors:
            return
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in tensors.values()}
        pinned = twins.pinned_storages(list(storages.values()))
        if not pinned:
            return
        with torch.no_grad():
            for t in tensors.values():
                own = t.untyped_storage()
                twin = pinned.get(own.data_ptr())
                if twin is None:
                    continue
                version = t._version
                t.set_(twin, t.storage_offset(), t.size(), t.stride())
                _set_versions((t,), (version,))
                self.swapped.append((t, own, twin.data_ptr(), version))

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for t, own, twin_ptr, version in self.swapped:
                if t.device.type == "cpu" and t.untyped_storage().data_ptr() == twin_ptr:
                    t.set_(own, t.storage_offset(), t.size(), t.stride())
                    _set_versions((t,), (version,))
        self.swapped.clear()
        twins.sweep()  # the CPU storages the module dropped may have been a mapping's last: unpin its twin


def to_device(storage: torch.UntypedStorage, device: str) -> torch.UntypedStorage:
    """``storage`` (a CPU storage of a hit) copied to ``device``, from its twin where it has a pinned one."""
    source = storage
    if twins.any_live() and device.startswith("cuda"):
        source = twins.pinned_storages([storage]).get(storage.data_ptr(), storage)
    return torch.empty(0, dtype=torch.uint8).set_(source).to(device).untyped_storage()
