"""Key stand-ins for transformers objects passed to a loader: configs and generation configs.

``AutoModel.from_pretrained(path)`` loads the config itself and passes it on as
``model_class.from_pretrained(path, config=config, ...)``; users write ``from_pretrained(path, config=cfg)``
too. A config is keyed by every instance attribute it has (public, private, nested sub-configs: the core
describes them all), except the few whose value is per-process bookkeeping rather than configuration:
``GenerationConfig._original_object_hash`` is a ``hash()`` of the object, different in every process.

A tokenizer passed to a loader (``pipeline(..., tokenizer=tok)``, a pipeline component) is an ordinary Python
object for the core's walk except for the parts the ``tokenizers`` library keeps in Rust: a
``tokenizers.Tokenizer`` is keyed by its complete JSON serialisation (``to_str()``: model, vocabulary,
merges, normalizer, pre-tokenizer, post-processor, decoder, added tokens, truncation and padding), an
``AddedToken`` by its state.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Attributes that differ between processes for one and the same configuration.
_PER_PROCESS = frozenset({"_original_object_hash"})


def _attributes(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items() if k not in _PER_PROCESS}


def _rust_stand_in(value: Any) -> Any:
    tokenizers = sys.modules.get("tokenizers")
    if tokenizers is None:
        return None
    if isinstance(value, tokenizers.Tokenizer):
        return ("tokenizers.Tokenizer", value.to_str())
    if isinstance(value, tokenizers.AddedToken):
        return ("tokenizers.AddedToken", value.__getstate__())
    return None


def key_for_value(value: Any) -> Any:
    """``(kind, class, attributes)`` for a ``PretrainedConfig`` or ``GenerationConfig``; the serialised form of
    a ``tokenizers`` object; ``None`` otherwise."""
    rust = _rust_stand_in(value)
    if rust is not None:
        return rust
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
