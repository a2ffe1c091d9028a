"""The transformers adapter: :data:`adapter`, the object the ``overmind.adapters`` entry point
names, whose hooks ``overmind.activate()`` registers.

Patched (each with the imported subclasses that override it; see :func:`overmind.adapter.collect`):
``PreTrainedModel``, the Auto model classes, ``AutoTokenizer``, ``AutoProcessor``, ``AutoImageProcessor``,
``AutoFeatureExtractor``, ``PreTrainedTokenizerBase``, ``ProcessorMixin``, ``ImageProcessingMixin`` and
``FeatureExtractionMixin``, all ``.from_pretrained``. ``transformers.pipeline(...)`` loads through these, so it
is covered too. A load an Auto class makes inside its own is a nested load: the Auto entry references the
model entry's weights instead of copying them.

This module declares what is transformers' own, with the two hooks only transformers has
(:class:`TransformersAdapter`); the hooks both Hugging Face adapters share are
:class:`overmind_hf.adapter.HubAdapter`'s.
"""
from __future__ import annotations

from overmind.adapter import Spec, hookimpl
from overmind_hf.adapter import HubAdapter

from . import hub_kernels, recorded_outputs, values
from . import self_check_sample as _sample
from .arguments import normalise

ADAPTER = "transformers"
SPECS = (
    Spec("transformers.modeling_utils:PreTrainedModel", lazy=True),
    # named where the Auto model classes copy its from_pretrained (modeling_auto): patched once they have, so that
    # each copy is of the original, then patched itself as an overrider
    Spec("transformers.models.auto.modeling_auto:_BaseAutoModelClass", lazy=True),
    Spec("transformers.models.auto.tokenization_auto:AutoTokenizer", lazy=True),
    Spec("transformers.models.auto.processing_auto:AutoProcessor", lazy=True),
    Spec("transformers.models.auto.image_processing_auto:AutoImageProcessor", lazy=True),
    Spec("transformers.models.auto.feature_extraction_auto:AutoFeatureExtractor", lazy=True),
    Spec("transformers.tokenization_utils_base:PreTrainedTokenizerBase", lazy=True),
    Spec("transformers.processing_utils:ProcessorMixin", lazy=True),
    Spec("transformers.image_processing_base:ImageProcessingMixin", lazy=True),
    Spec("transformers.feature_extraction_utils:FeatureExtractionMixin", lazy=True),
)
# Each loader is patched when its module is imported (lazy), however transformers' lazy imports reach it: a class
# cannot be called before its module is imported, and ``import transformers`` imports none of them; importing them
# for the patch would cost every process that imports transformers (diffusers does) modules it never uses.
DYNAMIC_MODULES = "transformers_modules"
key_for_value = values.key_for_value  # configs and generation configs by content, tokenizers' Rust parts
self_check_sample = _sample.sample  # a two-layer BERT and a word-level fast tokenizer, built in memory
self_check_describe = _sample.describe
refusal = hub_kernels.refusal  # a model whose layers run Hub kernels (transformers >= 5.25)
__all__ = ["ADAPTER", "SPECS", "DYNAMIC_MODULES", "normalise", "key_for_value", "self_check_sample",
           "self_check_describe", "refusal", "TransformersAdapter", "adapter"]


class TransformersAdapter(HubAdapter):
    """The Hugging Face adapter's hooks, and transformers' own two."""

    @hookimpl
    def overmind_after_unpickle(self, result, metadata):
        """A rebuilt model is registered where its constructor registers it
        (see :mod:`.recorded_outputs`)."""
        recorded_outputs.register(result)

    @hookimpl
    def overmind_reducers(self):
        """Fast tokenizers rebuild from their backend's parts (see :mod:`.tokenizer_reduce`)."""
        # late: activate() imports this plugin, and the reducers need json
        from . import tokenizer_reduce

        return tokenizer_reduce.reducers()


adapter = TransformersAdapter(__name__)
