"""The transformers adapter: the hooks ``overmind.activate()`` finds through the ``overmind.adapters`` entry point.

Patched (each with the imported subclasses that override it; see :mod:`.targets`): ``PreTrainedModel``,
the Auto model classes, ``AutoTokenizer``, ``AutoProcessor``, ``AutoImageProcessor``,
``AutoFeatureExtractor``, ``PreTrainedTokenizerBase``, ``ProcessorMixin``, ``ImageProcessingMixin`` and
``FeatureExtractionMixin``, all ``.from_pretrained``. ``transformers.pipeline(...)`` loads through these, so it
is covered too. A load an Auto class makes inside its own is a nested load: the Auto entry references the
model entry's weights instead of copying them.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import overmind
from overmind.key import Unkeyable

from . import arguments as args
from . import dispatch, dynamic_modules, hub, tokenizer_reduce, values
from .support import label, uncacheable, version_of, warn
from .targets import Spec, collect

ADAPTER = "transformers"
SPECS = (
    Spec("transformers.modeling_utils:PreTrainedModel"),
    Spec("transformers.models.auto.auto_factory:_BaseAutoModelClass"),
    Spec("transformers.models.auto.tokenization_auto:AutoTokenizer"),
    Spec("transformers.models.auto.processing_auto:AutoProcessor"),
    Spec("transformers.models.auto.image_processing_auto:AutoImageProcessor"),
    Spec("transformers.models.auto.feature_extraction_auto:AutoFeatureExtractor"),
    Spec("transformers.tokenization_utils_base:PreTrainedTokenizerBase"),
    Spec("transformers.processing_utils:ProcessorMixin"),
    Spec("transformers.image_processing_base:ImageProcessingMixin"),
    Spec("transformers.feature_extraction_utils:FeatureExtractionMixin"),
)
# Modules whose import defines the Auto model classes (each gets its own copy of from_pretrained).
_PRELOAD = ("transformers.models.auto.modeling_auto",)


@functools.lru_cache(maxsize=1)
def _roots() -> tuple[type, ...]:
    from .targets import resolve

    out = []
    for spec in SPECS:
        try:
            out.append(resolve(spec.where))
        except (ImportError, AttributeError):
            pass  # reported once, by overmind_patch_targets
    return tuple(out)


def _is_model_loader(owner: type) -> bool:
    from transformers.models.auto.auto_factory import _BaseAutoModelClass
    from transformers.modeling_utils import PreTrainedModel

    return issubclass(owner, (PreTrainedModel, _BaseAutoModelClass))


def _owns(loader: Any) -> bool:
    owner = getattr(loader, "owner", None)
    if "transformers" not in sys.modules:
        return False  # no transformers class exists yet; resolving the roots would import transformers
    return isinstance(owner, type) and issubclass(owner, _roots())


@overmind.hookimpl
def overmind_patch_targets():
    """Every transformers ``from_pretrained`` listed in :data:`SPECS`, with the subclasses overriding it."""
    import importlib

    for module in _PRELOAD:
        importlib.import_module(module)
    return collect(ADAPTER, SPECS)


@overmind.hookimpl
def overmind_reducers():
    """Fast tokenizers rebuild from their backend's parts (see :mod:`.tokenizer_reduce`)."""
    return tokenizer_reduce.reducers()


@overmind.hookimpl
def overmind_key_parts(loader, arguments):
    """Fold aliases and defaults; add the resolved Hub revision. See :mod:`.arguments`."""
    if not _owns(loader):
        return None
    try:
        args.lift_positional_path(arguments)
        if _is_model_loader(loader.owner):
            major = int(version_of("transformers").split(".")[0])
            args.fold_dtype(arguments, default="auto" if major >= 5 else None)
        elif "torch_dtype" in arguments or "dtype" in arguments:
            args.fold_dtype(arguments)
        parts = args.hub_parts(arguments)
        args.drop_fetch_only(arguments)
        return parts
    except Unkeyable:
        raise
    except Exception as e:  # never guess a key: an adapter that cannot read the call leaves it uncached
        warn(f"overmind: {label(ADAPTER)} could not read the arguments of {loader.name} ({type(e).__name__}: {e}); "
             f"loaded without the cache. Please report this with your transformers version.")
        raise uncacheable(f"{ADAPTER} adapter could not read the arguments: {e}") from e


@overmind.hookimpl
def overmind_key_for_value(value):
    """Configs and generation configs by content; huggingface_hub ``ResolvedRevision`` by commit."""
    return values.key_for_value(value) or hub.key_for_resolved_revision(value)


@overmind.hookimpl
def overmind_prepare_result(result, loader):
    """Refuse accelerate-dispatched results; name this adapter in pickling failures."""
    if not _owns(loader):
        return None
    return dispatch.guard(ADAPTER, result, loader)


@overmind.hookimpl
def overmind_entry_metadata(result, loader):
    """The ``transformers_modules`` the result's classes come from (remote code), with their source."""
    records = dynamic_modules.record(result, ("transformers_modules",))
    return {"transformers_modules": records} if records else None


@overmind.hookimpl
def overmind_before_unpickle(metadata):
    """Make the recorded ``transformers_modules`` importable in this process."""
    dynamic_modules.register(metadata.get("transformers_modules") or ())
