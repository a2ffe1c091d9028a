"""A cheaper reduce for the common tensor (a plain ``torch.Tensor`` or ``nn.Parameter`` on a strided layout),
keeping its version counter, or that it is an inference tensor; its rebuild is what an entry's
``rebuild_from_untyped`` resolves to under ``OVERMIND_ZEROCOPY=python``.

torch's own ``__reduce_ex__`` rebuilds every tensor through ``torch._utils._rebuild_tensor_v2``, a Python
path that also looks for fake-tensor modes; a pipeline's warm load rebuilds thousands of tensors, so that
overhead shows. Anything unusual (subclasses, conjugate or negative views, backward hooks, quantized,
sparse or meta tensors, tensor metadata) is left to torch's reduce by answering ``NotImplemented``.

Neither reduce keeps ``.grad`` (torch's drops it), so a leaf's gradient rides along as one more tensor
(its storage out of band like any other: zero-copy on rebuild) and is set again after the rebuild.

The cheaper reduce also keeps the tensor's version counter (``t._version``, what autograd compares to catch an
in-place change): rebuilding over a storage bumps it (``set_``), where the loader's own tensor may read 0 (a
safetensors load) or anything else, so the recorded value is set again. An inference tensor has none: it records
:data:`INFERENCE` instead, and is rebuilt under ``torch.inference_mode()``, an inference tensor again even where
the hit runs outside inference mode (a loader that enters it itself; the key holds the caller's mode). Every other
tensor is rebuilt outside inference mode (``codec.decode``), an ordinary tensor again even where the hit runs
inside it. An inference tensor left to torch's reduce is wrapped the same way (:func:`rebuild_inference`).

The storage travels as an :class:`UntypedStorageArg` (the pickler's persistent id for it carries no dtype), so a
rebuild gets the ``UntypedStorage`` itself, not a ``TypedStorage`` wrapper made only to be unwrapped again; with
``torch.empty(0)`` + ``set_`` and ``Parameter``'s own ``_make_subclass`` that costs less a tensor than torch's path,
over the 1,800 tensors of a Stable Diffusion pipeline (docs/architecture.md, "Measured costs").
"""
from __future__ import annotations

import pickle
import threading
from typing import Any

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_empty = torch.empty
_make_subclass = torch.Tensor._make_subclass
_Parameter = torch.nn.Parameter
_set_versions = torch._C._autograd._unsafe_set_version_counter  # ((tensor, ...), (version, ...))
_inference_mode = torch.inference_mode
INFERENCE = "inference"  # the recorded version of an inference tensor (which has no version counter)
met = threading.local()  # met.meta: a meta tensor was reduced in this thread since pickling.dumps reset it


class UntypedStorageArg:
    """A tensor's storage in a reduce: pickled out of band as the ``UntypedStorage`` itself (see
    entries/pickling.py)."""

    __slots__ = ("storage",)

    def __init__(self, storage: torch.UntypedStorage):
        self.storage = storage


def reduce_tensor(t: torch.Tensor) -> Any:
    cls = type(t)
    grad = t.grad if t.is_leaf else None  # a non-leaf's .grad is None unless retain_grad(), and warns
    if (cls not in _PLAIN or t.layout is not torch.strided or t.device.type == "meta" or t.is_quantized
            or t.is_conj() or t.is_neg() or t._backward_hooks or torch._utils.get_tensor_metadata(t)
            or (t.grad_fn is not None)):
        if t.device.type == "meta":
            met.meta = True
        if t.is_inference():  # torch's reduce, rebuilt in inference mode (codec.decode rebuilds outside it)
            rv = t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            return (rebuild_inference, (rv[0], rv[1])) + tuple(rv[2:])
        return NotImplemented if grad is None else _reduce_keeping_grad(t, grad)
    state = dict(t.__dict__) if t.__dict__ else None
    version = INFERENCE if t.is_inference() else t._version
    args = (UntypedStorageArg(t.untyped_storage()), t.dtype, t.storage_offset(), tuple(t.size()), t.stride(),
            t.requires_grad, cls is torch.nn.Parameter, state, grad, version)
    return (rebuild_from_untyped, args)


def rebuild_from_untyped(untyped: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: tuple, stride: tuple,
                         requires_grad: bool, is_parameter: bool, state: dict | None,
                         grad: torch.Tensor | None = None, version: int | str | None = None) -> torch.Tensor:
    """Inverse of :func:`reduce_tensor` (named in entries: keep its module path and signature; entries written
    before ``version`` was recorded leave the counter as the rebuild leaves it)."""
    if version == INFERENCE:
        with _inference_mode():
            return rebuild_from_untyped(untyped, dtype, offset, size, stride, requires_grad, is_parameter, state, grad)
    device = untyped.device
    t = (_empty(0, dtype=dtype) if device.type == "cpu" else _empty(0, dtype=dtype, device=device)).set_(
        untyped, offset, size, stride)
    if is_parameter:
        # What Parameter(t, requires_grad) does for a plain tensor, without its Python frame.
        t = _make_subclass(_Parameter, t, requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if state:
        t.__dict__.update(state)
    if grad is not None:
        t.grad = grad
    if version is not None and not t.is_inference():
        _set_versions((t,), (version,))  # type: ignore[arg-type]  # another str raises, as torch does
    return t


def rebuild_tensor(storage, offset: int, size: tuple, stride: tuple, requires_grad: bool, is_parameter: bool,
                   state: dict | None, grad: torch.Tensor | None = None) -> torch.Tensor:
    """The rebuild of entries written before :func:`rebuild_from_untyped` (a server may still hold some)."""
    return rebuild_from_untyped(storage._untyped_storage, storage.dtype, offset, size, stride, requires_grad,
                                is_parameter, state, grad)


def _reduce_keeping_grad(t: torch.Tensor, grad: torch.Tensor) -> tuple:
    """torch's own reduce of ``t``, with its rebuild wrapped to set ``.grad`` again."""
    rv = t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return (rebuild_with_grad, (rv[0], rv[1], grad)) + tuple(rv[2:])


def rebuild_inference(rebuild, args: tuple) -> torch.Tensor:
    """torch's own rebuild of an inference tensor, run in inference mode so that it is one again."""
    with _inference_mode():
        return rebuild(*args)


def rebuild_with_grad(rebuild, args: tuple, grad: torch.Tensor) -> torch.Tensor:
    t = rebuild(*args)
    t.grad = grad
    return t


def reducers() -> dict[type, Any]:
    return {torch.Tensor: reduce_tensor}
