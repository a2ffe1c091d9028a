"""Argument normalisation for diffusers loaders, so calls that load the same thing share one key.

- ``torch_dtype=`` (deprecated) is folded into ``dtype=``; ``"float16"`` and ``torch.float16`` are one value;
  ``None`` means "not given".
- ``token``, ``use_auth_token``, ``proxies`` and ``resume_download`` are dropped (they change how files are
  fetched, not what is loaded; a token must not reach the server's entry listing).
- A Hub id gets its resolved commit as an extra key part (the folding is shared: :mod:`overmind_hf.arguments`).
- A state dict handed to ``from_single_file`` (what a pipeline's ``from_single_file`` passes to each component)
  makes that inner load uncacheable: keying it would hash every tensor, and it has no file to share with
  other loads. The pipeline's own entry still holds the weights.
"""
from __future__ import annotations

from typing import Any

from overmind.adapter import uncacheable
from overmind_hf import arguments as common

SINGLE_FILE_DICT = "pretrained_model_link_or_path_or_dict"


def normalise(loader: Any, arguments: dict[str, Any]) -> list[tuple]:
    """Normalise ``arguments`` of a diffusers loader in place; return the extra key parts. Raises
    :class:`overmind.adapter.Uncacheable` for a state dict."""
    if isinstance(arguments.get(SINGLE_FILE_DICT), dict):
        raise uncacheable("from_single_file was given a state dict, not a file")
    common.fold_dtype(arguments)
    parts = common.hub_parts(arguments)
    common.drop_fetch_only(arguments)
    return parts
