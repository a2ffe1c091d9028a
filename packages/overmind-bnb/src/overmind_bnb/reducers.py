"""Pickle bitsandbytes' quantized parameters with their type and state, and rebuild them without a copy.

torch's own reduce for a ``Parameter`` subclass rebuilds a plain ``torch.nn.Parameter``: a cached
``Params4bit`` would come back without its class, so ``Linear4bit.forward`` would no longer find its
quantization state. The reducer here keeps three things apart:

- the packed weight (``uint8`` for 4-bit, ``int8`` for 8-bit), handed to the pickler as a plain tensor, so
  Overmind stores its storage out of band and rebuilds it over the shared mapping (on the device it was
  on: the core copies a CUDA storage back to its device, the server never sees CUDA);
- the constructor arguments ``(class, packed tensor, requires_grad)``: the parameter is recreated with
  ``torch.Tensor._make_subclass``, which wraps the same storage (this is what ``Params4bit.__new__`` and
  ``Params4bit.from_prequantized`` do; neither copies on the same device);
- the instance ``__dict__``: for 4-bit ``quant_state`` (absmax, quant map, nested statistics, blocksize,
  quant type, dtype, shape, and the CPU repacking fields once a forward has run), ``blocksize``,
  ``compress_statistics``, ``quant_type``, ``quant_storage``, ``bnb_quantized``, ``module``; for 8-bit
  ``CB``, ``SCB``, ``has_fp16_weights``; plus whatever else a library set (``_is_hf_initialized``).

The ``__dict__`` is restored by a state setter *after* the parameter exists in the pickle memo: it holds
``module``, the ``Linear4bit`` that in turn holds the parameter, and that cycle must resolve to one object.
``QuantState`` needs no reducer: it is a plain object whose tensors the core stores out of band, and pickle's
memo keeps ``Linear4bit.quant_state is Linear4bit.weight.quant_state``.

We rebuild with ``_make_subclass`` rather than ``from_prequantized(data, quant_state.as_dict(packed=True))``
because the latter builds a *new* ``QuantState`` (breaking that identity, and dropping the fields bitsandbytes
adds when it repacks 4-bit weights for its CPU kernel) and packs the small statistics into an extra tensor
per parameter.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

if TYPE_CHECKING:
    import torch

__all__ = ["reduce_quantized_param", "rebuild_quantized_param", "restore_param_state", "reducer_table"]


def reduce_quantized_param(param: torch.Tensor) -> tuple:
    """``__reduce__`` for ``Params4bit`` and ``Int8Params`` (and their subclasses).

    >>> pickler.reducer_override = lambda o: reduce_quantized_param(o) if isinstance(o, Params4bit) else NotImplemented
    """
    # param.data is a plain torch.Tensor over the same storage: the pickler stores that storage out of band.
    state = dict(param.__dict__)
    return (rebuild_quantized_param, (type(param), param.data, param.requires_grad), state, None, None,
            restore_param_state)


def rebuild_quantized_param(cls: type, data: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """Wrap ``data`` (already on its device, possibly over a shared mapping) as a ``cls`` parameter, no copy."""
    import torch

    return torch.Tensor._make_subclass(cls, data, requires_grad)


def restore_param_state(param: torch.Tensor, state: dict[str, Any]) -> None:
    """Pickle state setter: put the quantization attributes back on the rebuilt parameter."""
    param.__dict__.update(state)


def _quantized_param_types() -> tuple[type, ...]:
    from bitsandbytes.nn import Int8Params, Params4bit

    return (Params4bit, Int8Params)


def _reduce_if_quantized(param: torch.Tensor) -> Any:
    """Reducer registered on ``torch.nn.Parameter`` while bitsandbytes is not imported yet (see below)."""
    if "bitsandbytes.nn" not in sys.modules:
        return NotImplemented  # no bitsandbytes parameter can exist before bitsandbytes is imported
    if isinstance(param, _quantized_param_types()):
        return reduce_quantized_param(param)
    return NotImplemented


def reducer_table() -> dict[type, Callable[[Any], Any]]:
    """The ``{type: reducer}`` table for ``overmind_reducers``.

    Importing bitsandbytes takes about two seconds, and Overmind asks for reducers on the first cache miss of
    any load (a diffusers pipeline, say) and keeps the answer. If bitsandbytes is imported, the table names
    ``Params4bit`` and ``Int8Params``. If not, it holds one reducer on ``torch.nn.Parameter`` that hands
    bitsandbytes parameters to :func:`reduce_quantized_param` once bitsandbytes shows up and answers
    ``NotImplemented`` (pickle's default) for every other parameter.
    """
    if "bitsandbytes.nn" in sys.modules:
        return {t: reduce_quantized_param for t in _quantized_param_types()}
    import torch

    return {torch.nn.Parameter: _reduce_if_quantized}
