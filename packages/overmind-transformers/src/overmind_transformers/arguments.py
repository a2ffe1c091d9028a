"""Argument normalisation for transformers loaders, so calls that load the same thing share one key.

- The Auto model classes' ``from_pretrained`` has the signature ``(*model_args, **kwargs)``, so the path
  arrives inside ``model_args``; it is moved to ``pretrained_model_name_or_path`` as for every other loader.
- ``torch_dtype=`` (deprecated) is folded into ``dtype=``; ``"float16"`` and ``torch.float16`` are one value;
  for models an absent or ``None`` dtype is ``"auto"``, the default since transformers 5. Other loaders
  (tokenizers, processors) have their dtype folded only where one is given.
- Fetch-only arguments (``token``...) are dropped; a Hub id gets its resolved commit as an extra key part.
  Both are shared with diffusers: :mod:`overmind_hf.arguments`.
- ``use_kernels`` is keyed as the load resolves it (the argument, else ``USE_HUB_KERNELS``), with the ``kernels``
  version (:mod:`.hub_kernels`).
"""
from __future__ import annotations

from overmind.adapter import version_of
from overmind_hf import arguments as common

from . import hub_kernels

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _is_model_loader(owner: type) -> bool:
    from transformers.modeling_utils import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return issubclass(owner, (PreTrainedModel, _BaseAutoModelClass))


def normalise(loader: Any, arguments: dict[str, Any]) -> list[tuple]:
    """Normalise ``arguments`` of a transformers loader in place; return the extra key parts."""
    common.lift_positional_path(arguments)
    if _is_model_loader(loader.owner):
        major = int(version_of("transformers").split(".")[0])
        common.fold_dtype(arguments, default="auto" if major >= 5 else None)
    elif "torch_dtype" in arguments or "dtype" in arguments:
        common.fold_dtype(arguments)
    parts = common.hub_parts(arguments)
    common.drop_fetch_only(arguments)
    if _is_model_loader(loader.owner):
        kernels = hub_kernels.key_part(arguments)  # what the load does with Hub kernels (transformers >= 5.25)
        if kernels is not None:
            arguments.pop("use_kernels", None)
            parts.append(kernels)
    return parts
