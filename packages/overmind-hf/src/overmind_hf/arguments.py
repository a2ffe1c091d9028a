"""Argument folding both Hugging Face libraries share, so calls that load the same thing share one key.

- ``torch_dtype=`` (deprecated) is folded into ``dtype=``; ``"float16"`` and ``torch.float16`` are one value
  (each adapter says what an absent dtype stands for).
- The ``(*model_args, **kwargs)`` signatures (transformers' Auto model classes) get the path moved from
  ``model_args`` to ``pretrained_model_name_or_path`` as for every other loader.
- ``token``, ``use_auth_token``, ``proxies`` and ``resume_download`` change how files are fetched, not what is
  loaded; they are dropped (a token must never reach the server's entry listing either).
- A Hub id gets its resolved commit as an extra key part (:mod:`.hub`).
"""
from __future__ import annotations

from . import hub

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

PATH_NAMES = ("pretrained_model_name_or_path", "pretrained_model_or_path", "pretrained_model_link_or_path",
              "pretrained_model_link_or_path_or_dict", "pretrained_model_path")
FETCH_ONLY = ("token", "use_auth_token", "proxies", "resume_download")


def model_path(arguments: Mapping[str, Any]) -> Any:
    """The model path or Hub id a loader was called with, or ``None``."""
    name = path_argument(arguments)
    return None if name is None else arguments[name]


def path_argument(arguments: Mapping[str, Any]) -> str | None:
    """The name of the argument that holds the model path or Hub id (one of :data:`PATH_NAMES`), or ``None``."""
    return next((name for name in PATH_NAMES if arguments.get(name) is not None), None)


def lift_positional_path(arguments: dict[str, Any]) -> None:
    """``(*model_args, **kwargs)`` signatures: move the first positional into ``pretrained_model_name_or_path``."""
    model_args = arguments.get("model_args")
    if "pretrained_model_name_or_path" not in arguments and isinstance(model_args, tuple) and model_args:
        arguments["pretrained_model_name_or_path"] = model_args[0]
        arguments["model_args"] = model_args[1:]


def fold_dtype(arguments: dict[str, Any], default: Any = None) -> None:
    """Fold ``torch_dtype`` into ``dtype`` and canonicalise its spelling; ``default`` stands for "not given"."""
    torch_dtype = arguments.pop("torch_dtype", None)
    dtype = arguments.get("dtype")
    if dtype is None:
        dtype = torch_dtype
    if isinstance(dtype, str) and dtype != "auto":
        import torch

        as_dtype = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(as_dtype, torch.dtype):
            dtype = as_dtype
    if dtype is None or dtype == default:
        arguments.pop("dtype", None)
        if default is not None:
            arguments["dtype"] = default
    else:
        arguments["dtype"] = dtype
    # A dict dtype ({"text_encoder": torch.float16, ...}) is keyed as given.


def drop_fetch_only(arguments: dict[str, Any]) -> None:
    """Drop the arguments that change how files are fetched, not what is loaded."""
    for name in FETCH_ONLY:
        arguments.pop(name, None)


def hub_parts(arguments: dict[str, Any]) -> list[tuple]:
    """The resolved-revision key part when the path is a Hub id, else nothing."""
    path = model_path(arguments)
    return [hub.revision_part(path, arguments)] if hub.looks_like_repo_id(path) else []
