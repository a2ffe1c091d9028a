"""Argument normalisation for diffusers loaders, so calls that load the same thing share one key.

- ``torch_dtype=`` is folded into ``dtype=`` where diffusers reads them as one argument (0.40 and later:
  ``dtype=`` there, ``torch_dtype=`` deprecated); an explicit ``torch_dtype=None`` means "not given". Before
  0.40 diffusers knows only ``torch_dtype=``: a ``dtype=`` is an unexpected keyword (a model's config rejects
  it, a pipeline ignores it), so both are keyed as given. Both given at once are keyed as given too (a
  pipeline raises, a model takes ``dtype``). The value is never respelled: diffusers loads a string such as
  ``"float16"`` as float32 (with a warning), unlike transformers, so ``"float16"`` is not ``torch.float16``.
- ``token``, ``use_auth_token``, ``proxies`` and ``resume_download`` are dropped (they change how files are
  fetched, not what is loaded; a token must not reach the server's entry listing).
- A Hub id gets its resolved commit as an extra key part (the folding is shared: :mod:`overmind_hf.arguments`).
- A state dict handed to ``from_single_file`` (what a pipeline's ``from_single_file`` passes to each component)
  makes that inner load uncacheable: keying it would hash every tensor, and it has no file to share with
  other loads. The pipeline's own entry still holds the weights.
"""
from __future__ import annotations

from overmind.adapter import Uncacheable, version_of
from overmind_hf import arguments as common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SINGLE_FILE_DICT = "pretrained_model_link_or_path_or_dict"
DTYPE_SINCE = (0, 40)  # the first diffusers whose loaders read dtype= (and torch_dtype= as its alias)


def reads_dtype(version: str | None = None) -> bool:
    """Whether diffusers ``version`` (the installed one by default) reads ``dtype=`` in its loaders."""
    parts = (version or version_of("diffusers")).split(".")[:2]
    try:
        return tuple(int(p) for p in parts) >= DTYPE_SINCE
    except ValueError:
        return True  # a development build of a version too new to read: the current spelling


def fold_dtype(arguments: dict[str, Any]) -> None:
    """Key ``torch_dtype=`` and ``dtype=`` as the one argument they are to the installed diffusers."""
    one_argument = reads_dtype()
    for name in ("torch_dtype", "dtype") if one_argument else ("torch_dtype",):
        if name in arguments and arguments[name] is None:
            del arguments[name]  # the loaders' own default
    if one_argument and "torch_dtype" in arguments and "dtype" not in arguments:
        arguments["dtype"] = arguments.pop("torch_dtype")


def normalise(loader: Any, arguments: dict[str, Any]) -> list[tuple]:
    """Normalise ``arguments`` of a diffusers loader in place; return the extra key parts. Raises
    :class:`overmind.adapter.Uncacheable` for a state dict."""
    if isinstance(arguments.get(SINGLE_FILE_DICT), dict):
        raise Uncacheable("from_single_file was given a state dict, not a file")
    fold_dtype(arguments)
    parts = common.hub_parts(arguments)
    common.drop_fetch_only(arguments)
    return parts
