"""What ``PreTrainedModel.__init__`` writes outside the model, made again for a rebuilt one: its class's
``_can_record_outputs`` in transformers' process-wide ``_CAN_RECORD_REGISTRY`` (transformers >= 5), which the hooks
behind ``output_hidden_states`` and ``output_attentions`` read. A rebuild runs no constructor, so without this a
process that only hit would return ``None`` for those outputs.

Overmind's core records such writes on a miss and replays them on a hit by itself (``overmind/loading/writes``);
this declaration covers the miss that cannot see the write because the process had made it already (a model of the
same class built before the load). ``declared = False`` turns it off (the tests that prove the core's recorder
finds the registry alone do).
"""
from __future__ import annotations

import sys
from typing import Any, Iterator

declared = True


def register(result: Any) -> None:
    """Register every transformers model ``result`` holds, as its constructor did."""
    if not declared:
        return
    capturing = sys.modules.get("transformers.utils.output_capturing")
    modeling = sys.modules.get("transformers.modeling_utils")
    registry = getattr(capturing, "_CAN_RECORD_REGISTRY", None)
    model_type = getattr(modeling, "PreTrainedModel", None)
    if registry is None or model_type is None:
        return  # a transformers without the registry, or none of its models rebuilt here
    for module in _modules(result):
        if isinstance(module, model_type):
            registry[module] = module._can_record_outputs


def _modules(result: Any) -> Iterator[Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    module_type = torch.nn.Module
    if isinstance(result, module_type):
        yield from result.modules()
        return
    for value in list(getattr(result, "__dict__", {}).values()):  # a pipeline's components
        if isinstance(value, module_type):
            yield from value.modules()
