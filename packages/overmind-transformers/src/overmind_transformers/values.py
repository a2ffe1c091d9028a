"""Key stand-ins for transformers objects passed to a loader: configs and generation configs.

``AutoModel.from_pretrained(path)`` loads the config itself and passes it on as
``model_class.from_pretrained(path, config=config, ...)``; users write ``from_pretrained(path, config=cfg)``
too. A config is fully described by its ``to_dict()`` plus the private attributes ``to_dict`` leaves out but
loading reads (``_attn_implementation_internal`` and friends), so that is its key.
"""
from __future__ import annotations

from typing import Any

_PLAIN = (str, int, float, bool, type(None))
# Private config attributes that change what gets built. Not all private ones: some vary per process
# (GenerationConfig._original_object_hash is a hash() of the object).
_PRIVATE_KEYED = ("_attn_implementation", "_experts_implementation", "_name_or_path", "_commit_hash")


def _private_plain(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(obj).items())
            if k.startswith(_PRIVATE_KEYED) and isinstance(v, _PLAIN)}


def key_for_value(value: Any) -> Any:
    """``(kind, dict)`` for a ``PretrainedConfig`` or ``GenerationConfig``; ``None`` for anything else."""
    import sys

    configuration_utils = sys.modules.get("transformers.configuration_utils")
    generation = sys.modules.get("transformers.generation.configuration_utils")
    config_base = getattr(configuration_utils, "PreTrainedConfig", None) or getattr(
        configuration_utils, "PretrainedConfig", None)
    if config_base is not None and isinstance(value, config_base):
        return ("config", value.to_dict(), _private_plain(value))
    gen_base = getattr(generation, "GenerationConfig", None)
    if gen_base is not None and isinstance(value, gen_base):
        return ("generation-config", value.to_dict())
    return None
