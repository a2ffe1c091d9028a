"""Cache-key parts for bitsandbytes loads.

- A ``BitsAndBytesConfig`` (transformers' or diffusers') is keyed by its ``to_dict()``, which lists every
  field with its default filled in: ``BitsAndBytesConfig(load_in_4bit=True)`` and the same with
  ``bnb_4bit_quant_type="fp4"`` spelled out are one key; ``bnb_4bit_compute_dtype=torch.float16`` and
  ``"float16"`` are one key.
- A load that quantizes also keys the bitsandbytes version (the packed layout and the quantization state
  are bitsandbytes' own formats) and the number of visible CUDA devices (``device_map="auto"`` places the
  quantized weights by what this process sees).

Nothing here imports transformers, diffusers, bitsandbytes or torch: the hooks run on every ``overmind.load``.
"""
from __future__ import annotations

import enum
import sys

from overmind.adapter import raise_users

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CONFIG_MODULES", "is_bnb_config", "config_stand_in", "key_parts"]

# Where the libraries define their BitsAndBytesConfig; looked up in sys.modules only.
CONFIG_MODULES = ("transformers.utils.quantization_config", "diffusers.quantizers.quantization_config")


def is_bnb_config(value: Any) -> bool:
    """Whether ``value`` is a transformers or diffusers ``BitsAndBytesConfig`` (no import is made)."""
    for name in CONFIG_MODULES:
        cls = getattr(sys.modules.get(name), "BitsAndBytesConfig", None)
        if cls is not None and isinstance(value, cls):
            return True
    return False


def _plain(value: Any) -> Any:
    """``to_dict()`` output as the plain values a key stand-in may hold (enums and dtypes become strings)."""
    if value is None or isinstance(value, (bool, int, float, bytes)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if type(value).__module__ == "torch":  # torch.dtype / torch.device
        return str(value)
    raise TypeError(f"overmind-bnb: BitsAndBytesConfig field of type {type(value).__qualname__} cannot be keyed; "
                    f"update overmind-bnb for this transformers/diffusers version")


def config_stand_in(config: Any) -> tuple:
    """The key stand-in of a ``BitsAndBytesConfig``: ``("BitsAndBytesConfig", "<module>", {fields})``."""
    return ("BitsAndBytesConfig", type(config).__module__, _plain(config.to_dict()))


def _bnb_configs(arguments: dict[str, Any]) -> list[Any]:
    found = []
    for value in arguments.values():
        if is_bnb_config(value):
            found.append(value)
        elif isinstance(value, dict):  # e.g. diffusers' PipelineQuantizationConfig-like dicts of configs
            found.extend(v for v in value.values() if is_bnb_config(v))
    return found


def _cuda_device_count() -> int:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def key_parts(arguments: dict[str, Any]) -> list[Any] | None:
    """Extra key parts when a call quantizes with bitsandbytes, else ``None``."""
    if not _bnb_configs(arguments):
        return None
    try:
        from importlib.metadata import version

        bnb_version = version("bitsandbytes")
    except Exception as exc:  # not installed: the load itself will fail and say so
        raise_users(exc)
        bnb_version = None
    return [("bitsandbytes", bnb_version, "cuda_devices", _cuda_device_count())]
