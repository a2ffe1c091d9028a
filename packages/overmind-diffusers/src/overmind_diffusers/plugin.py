"""The diffusers adapter: the hooks ``overmind.activate()`` finds through the ``overmind.adapters`` entry point.

Patched (each with the imported subclasses that override it; see ``overmind_transformers.targets``):
``DiffusionPipeline.from_pretrained``, the four AutoPipeline classes, ``ModelMixin.from_pretrained``
(``LegacyModelMixin``, ``MultiControlNetModel``, ``MultiAdapter`` override it), ``FromSingleFileMixin`` and
``FromOriginalModelMixin.from_single_file``, ``SchedulerMixin.from_pretrained`` and diffusers' ``AutoModel``.
A pipeline loads its components through these same class methods, so each component is its own entry and the
pipeline's entry references their weights.
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import overmind
from overmind.key import Unkeyable
from overmind_transformers import dispatch, dynamic_modules, hub
from overmind_transformers.support import label, uncacheable, warn
from overmind_transformers.targets import Spec, collect, resolve

from . import arguments as call_arguments
from . import values

ADAPTER = "diffusers"
SPECS = (
    Spec("diffusers.pipelines.pipeline_utils:DiffusionPipeline"),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForText2Image"),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForImage2Image"),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForInpainting"),
    Spec("diffusers.pipelines.auto_pipeline:AutoPipelineForText2Audio"),
    Spec("diffusers.models.modeling_utils:ModelMixin"),
    Spec("diffusers.models.auto_model:AutoModel"),
    Spec("diffusers.loaders.single_file:FromSingleFileMixin", "from_single_file"),
    Spec("diffusers.loaders.single_file_model:FromOriginalModelMixin", "from_single_file"),
    Spec("diffusers.schedulers.scheduling_utils:SchedulerMixin"),
)
# Modules that define the ModelMixin subclasses overriding from_pretrained (diffusers imports lazily).
_PRELOAD = ("diffusers.models.controlnets.multicontrolnet", "diffusers.models.controlnets.multicontrolnet_union",
            "diffusers.models.adapter")


@functools.lru_cache(maxsize=1)
def _roots() -> tuple[type, ...]:
    out = []
    for spec in SPECS:
        try:
            out.append(resolve(spec.where))
        except (ImportError, AttributeError):
            pass  # reported once, by overmind_patch_targets
    return tuple(out)


def _owns(loader: Any) -> bool:
    owner = getattr(loader, "owner", None)
    if "diffusers" not in sys.modules:
        return False  # no diffusers class exists yet; resolving the roots would import diffusers
    return isinstance(owner, type) and issubclass(owner, _roots())


@overmind.hookimpl
def overmind_patch_targets():
    """Every diffusers loader listed in :data:`SPECS`, with the subclasses overriding it."""
    for module in _PRELOAD:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # an older diffusers without it: nothing there to patch
    return collect(ADAPTER, SPECS)


@overmind.hookimpl
def overmind_key_parts(loader, arguments):
    """Fold ``torch_dtype`` into ``dtype``; add the resolved Hub revision. See :mod:`.arguments`."""
    if not _owns(loader):
        return None
    try:
        return call_arguments.normalise(arguments)
    except Unkeyable:
        raise
    except Exception as e:  # never guess a key: an adapter that cannot read the call leaves it uncached
        warn(f"overmind: {label(ADAPTER)} could not read the arguments of {loader.name} ({type(e).__name__}: {e}); "
             f"loaded without the cache. Please report this with your diffusers version.")
        raise uncacheable(f"{ADAPTER} adapter could not read the arguments: {e}") from e



@overmind.hookimpl
def overmind_key_for_value(value):
    """Schedulers by config; hand-built MultiControlNetModels by their nets; Hub ``ResolvedRevision``."""
    return values.key_for_value(value) or hub.key_for_resolved_revision(value)


@overmind.hookimpl
def overmind_prepare_result(result, loader):
    """Refuse accelerate-dispatched pipelines and models; name this adapter in pickling failures."""
    if not _owns(loader):
        return None
    return dispatch.guard(ADAPTER, result, loader)


@overmind.hookimpl
def overmind_entry_metadata(result, loader):
    """The ``diffusers_modules`` (custom pipelines and components) the result's classes come from."""
    records = dynamic_modules.record(result, ("diffusers_modules",))
    return {"diffusers_modules": records} if records else None


@overmind.hookimpl
def overmind_before_unpickle(metadata):
    """Make the recorded ``diffusers_modules`` importable in this process."""
    dynamic_modules.register(metadata.get("diffusers_modules") or ())
