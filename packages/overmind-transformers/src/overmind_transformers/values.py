"""Key stand-ins for transformers objects passed to a loader: configs and generation configs.

``AutoModel.from_pretrained(path)`` loads the config itself and passes it on as
``model_class.from_pretrained(path, config=config, ...)``; users write ``from_pretrained(path, config=cfg)``
too. A config is keyed by every instance attribute it has (public, private, nested sub-configs: the core
describes them all), except the few whose value is per-process bookkeeping rather than configuration:
``GenerationConfig._original_object_hash`` is a ``hash()`` of the object, different in every process.
"""
from __future__ import annotations

import sys
from typing import Any

# Attributes that differ between processes for one and the same configuration.
_PER_PROCESS = frozenset({"_original_object_hash"})


def _attributes(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items() if k not in _PER_PROCESS}


def key_for_value(value: Any) -> Any:
    """``(kind, class, attributes)`` for a ``PretrainedConfig`` or ``GenerationConfig``; ``None`` otherwise."""
    configuration_utils = sys.modules.get("transformers.configuration_utils")
    generation = sys.modules.get("transformers.generation.configuration_utils")
    config_base = getattr(configuration_utils, "PreTrainedConfig", None) or getattr(
        configuration_utils, "PretrainedConfig", None)
    if config_base is not None and isinstance(value, config_base):
        return ("config", type(value), _attributes(value))
    gen_base = getattr(generation, "GenerationConfig", None)
    if gen_base is not None and isinstance(value, gen_base):
        return ("generation-config", type(value), _attributes(value))
    return None
