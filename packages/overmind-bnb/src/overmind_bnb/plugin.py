"""The overmind-bnb adapter: the ``overmind_*`` hooks for bitsandbytes-quantized models.

Registered under the entry point ``overmind.adapters: bnb``. It patches no loader: quantized models are
loaded by ``from_pretrained`` (patched by overmind-transformers / overmind-diffusers) or by the user's own
function through ``overmind.load``; this adapter makes their results cacheable and keys the quantization.

- ``overmind_reducers``: ``Params4bit`` / ``Int8Params`` keep their class and quantization state, zero-copy.
- ``overmind_prepare_result``: accelerate's dispatch hooks and move guards off a quantized model while it is
  pickled, back on afterwards; on CPU, the repacked form of its 4-bit weights computed and pickled beside them.
  The adapter declares this to the accelerate rule (:func:`overmind_hf.dispatch.carries_hooks`), so the
  Hugging Face adapters do not refuse a dispatched quantized model, whichever adapter's hook runs first.
- ``overmind_after_unpickle``: the same hooks and guards rebuilt on the cached copy; the repacked 4-bit forms
  handed to the copy's first forward, so its weights stay in shared memory (:mod:`overmind_bnb.packing`).
- ``overmind_key_for_value`` / ``overmind_key_parts``: ``BitsAndBytesConfig`` and the bitsandbytes version.
- ``overmind_self_check``: on an untested bitsandbytes release, quantized layers through the entry codec.
"""
from __future__ import annotations

import contextlib
import sys

from overmind.adapter import SelfCheck, hookimpl
from overmind_hf import dispatch as accelerate_rule

from . import dispatch, keys, packing, reducers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ContextManager, Iterator, Mapping


@hookimpl
def overmind_reducers() -> Mapping[type, Any]:
    """Reducers for bitsandbytes' quantized parameters (see :mod:`overmind_bnb.reducers`)."""
    return reducers.reducer_table()


@hookimpl
def overmind_self_check() -> SelfCheck:
    """On a bitsandbytes release newer than the tested range: a 4-bit and an 8-bit layer, quantized on the CPU,
    come back from the entry codec with their classes, quantization state and bytes (it patches no loader)."""
    return SelfCheck(sample=_quantized_sample)


def _quantized_sample() -> Any:
    import bitsandbytes as bnb
    import torch

    four = bnb.nn.Linear4bit(16, 8, quant_type="nf4", compute_dtype=torch.float32).to("cpu")
    eight = bnb.nn.Linear8bitLt(16, 8, has_fp16_weights=False).to("cpu")
    return torch.nn.Sequential(four, eight)


@hookimpl
def overmind_key_for_value(value: Any) -> Any:
    """``BitsAndBytesConfig`` -> ``("BitsAndBytesConfig", module, to_dict())``; anything else: not ours."""
    if keys.is_bnb_config(value):
        return keys.config_stand_in(value)
    return None


@hookimpl
def overmind_key_parts(loader: Any, arguments: dict[str, Any]) -> Any:
    """The bitsandbytes version and visible CUDA device count, for calls that pass a ``BitsAndBytesConfig``."""
    return keys.key_parts(arguments)


@hookimpl
def overmind_prepare_result(result: Any, loader: Any) -> ContextManager | None:
    """While a quantized result is pickled: accelerate's dispatch hooks and move guards off, and the CPU
    packing of its 4-bit weights precomputed beside them (see :mod:`overmind_bnb.packing`)."""
    quantized = [m for m in _modules_in(result) if _is_quantized(m)]
    dispatched = [m for m in quantized if dispatch.has_dispatch_state(m)]
    repackable = [m for m in quantized if packing.has_repackable(m)]
    return _readied(dispatched, repackable) if dispatched or repackable else None


@contextlib.contextmanager
def _readied(dispatched: list[Any], repackable: list[Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if dispatched:
            stack.enter_context(dispatch.stripped(dispatched))
        if repackable:
            stack.enter_context(packing.precomputed(repackable))
        yield


# tryfirst: the hooks and guards go back before any other adapter's turn in the chain, so each one sees the
# cached copy as a freshly loaded model.
@hookimpl(tryfirst=True)
def overmind_after_unpickle(result: Any, metadata: Mapping[str, Any]) -> None:
    """Rebuild accelerate's hooks and guards on a cached copy that had them; keep the object (``None``)."""
    for module in _modules_in(result):
        if dispatch.MARKER in module.__dict__:
            dispatch.reattach(module)
        if packing.MARKER in module.__dict__:
            packing.adopt(module)
    return None


def _modules_in(result: Any) -> Iterator[Any]:
    """The ``torch.nn.Module`` objects a loader returned: the result itself, or the values of a tuple, list,
    dict or plain object (a pipeline's components), one level deep."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    module_type = torch.nn.Module
    if isinstance(result, module_type):
        yield result
        return
    if isinstance(result, (tuple, list)):
        values = result
    elif isinstance(result, dict):
        values = result.values()
    else:
        values = getattr(result, "__dict__", {}).values()
    seen = set()
    for value in values:
        if isinstance(value, module_type) and id(value) not in seen:
            seen.add(id(value))
            yield value


def _carries_hooks(root: Any) -> bool:
    """The roots :func:`overmind_prepare_result` takes accelerate's hooks off (and puts back on the copy);
    that hook runs once bitsandbytes is imported (the adapter is live), so before that none is claimed."""
    return "bitsandbytes" in sys.modules and _is_quantized(root) and dispatch.has_dispatch_state(root)


def _is_quantized(module: Any) -> bool:
    """Whether ``module`` holds bitsandbytes layers or was loaded with a bitsandbytes quantization config.

    The second case matters: ``llm_int8_enable_fp32_cpu_offload`` keeps offloaded modules unquantized, so a
    model can be a bitsandbytes load without holding a bitsandbytes layer on this machine.
    """
    if str(getattr(getattr(module, "quantization_method", None), "value", "")) == "bitsandbytes":
        return True
    bnb_nn = sys.modules.get("bitsandbytes.nn")
    if bnb_nn is None:
        return False
    layers = (bnb_nn.Linear4bit, bnb_nn.Linear8bitLt)
    return any(isinstance(m, layers) for m in module.modules())


# Declared once, at import: the Hugging Face adapters' accelerate rule lets these dispatched models through.
accelerate_rule.carries_hooks("bnb", _carries_hooks)
