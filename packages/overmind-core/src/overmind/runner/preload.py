"""What a template imports before it forks: the preload list, how a user sets it, and importing it.

The list is a sequence of entries, each ``module`` or ``module:attribute`` (the attribute is fetched too,
which makes a lazily-importing library such as diffusers import the class's code). ``@default`` stands for
the default list: ``torch``, then the libraries of every active adapter (with a few classes of each, from
``LAZY_ATTRIBUTES``, since diffusers and transformers import almost nothing until a class is asked for).

How the list is chosen, lowest to highest precedence:

1. ``@default``.
2. The project's ``pyproject.toml`` (the nearest one above the script, or above the working directory
   for ``-m`` and ``-c``), table ``[tool.overmind]``: ``preload = [...]`` *replaces* the default,
   ``preload-extra = [...]`` *adds* to it (or to ``preload``).
3. ``OVERMIND_PRELOAD``: ``a,b`` *replaces* everything above; ``+a,b`` *adds* to it; an empty value
   preloads nothing (the template then only saves the interpreter's own start-up).

``overmind`` itself is always imported and activated. The user's own modules are never preloaded: an
entry is imported in the template with the script's folder and the working directory off ``sys.path``.

>>> resolve("/home/me/proj", {"OVERMIND_PRELOAD": "+sentence_transformers"})
['@default', 'sentence_transformers']
"""
from __future__ import annotations

import os
import time

from ..errors import OvermindError

ENV = "OVERMIND_PRELOAD"
DEFAULT = "@default"
# Classes whose import pulls in the bulk of a lazily-importing library (diffusers and transformers import
# a module only when one of its names is first used). Missing names are skipped.
LAZY_ATTRIBUTES = {
    "diffusers": ["ModelMixin", "DiffusionPipeline", "AutoencoderKL", "UNet2DConditionModel", "ControlNetModel",
                  "StableDiffusionPipeline", "StableDiffusionControlNetPipeline"],
    "transformers": ["PreTrainedModel", "AutoModel", "AutoTokenizer", "AutoConfig", "CLIPTextModel",
                     "CLIPTokenizer", "CLIPImageProcessor", "BertModel", "BertTokenizerFast"],
}


class PreloadSettingError(OvermindError, ValueError):
    """A preload setting cannot be read (a malformed pyproject.toml table); the message names the file."""


def resolve(start_dir: str, environ: dict[str, str]) -> list[str]:
    """The preload entries for a program started from ``start_dir`` with ``environ`` (``@default`` unexpanded)."""
    entries = [DEFAULT]
    table = project_table(start_dir)
    if table is not None:
        path, settings = table
        if "preload" in settings:
            entries = _entries(settings["preload"], f"{path}: [tool.overmind] preload")
        if "preload-extra" in settings:
            entries = entries + _entries(settings["preload-extra"], f"{path}: [tool.overmind] preload-extra")
    value = environ.get(ENV)
    if value is not None:
        if value.startswith("+"):
            entries = entries + _split(value[1:])
        else:
            entries = _split(value)
    return _unique(entries)


def project_table(start_dir: str) -> tuple[str, dict] | None:
    """``(path, [tool.overmind] table)`` of the nearest ``pyproject.toml`` at or above ``start_dir``, or None."""
    directory = os.path.abspath(start_dir)
    while True:
        path = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(path):
            import tomllib

            try:
                with open(path, "rb") as f:
                    data = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise PreloadSettingError(f"cannot read {path}: {exc}") from None
            table = data.get("tool", {}).get("overmind")
            return (path, table) if isinstance(table, dict) else None
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def expand(entries: list[str]) -> list[str]:
    """``entries`` with ``@default`` replaced by torch and the active adapters' libraries (in the template,
    after ``overmind.activate()``)."""
    out: list[str] = []
    for entry in entries:
        out.extend(default_entries() if entry == DEFAULT else [entry])
    return _unique(out)


def default_entries() -> list[str]:
    """``torch`` and, for each active adapter, its libraries (with ``LAZY_ATTRIBUTES``)."""
    from ..adapters import discovery

    out = ["torch"]
    for state in discovery.states().values():
        if state.status != "loaded":
            continue
        for group in state.modules:
            module = group[0]
            out.append(module)
            out.extend(f"{module}:{name}" for name in LAZY_ATTRIBUTES.get(module, ()))
    return out


def import_all(entries: list[str]) -> tuple[list[str], dict[str, str], float]:
    """Import every entry; returns the ones that imported, ``{entry: why}`` for the others, and the seconds."""
    import importlib  # (here, in the template: the launcher imports this module, and importlib brings warnings)

    t0 = time.monotonic()
    done, failed = [], {}
    for entry in entries:
        module, _, attribute = entry.partition(":")
        try:
            obj = importlib.import_module(module)
            if attribute:
                getattr(obj, attribute)
        except BaseException as exc:  # a library's import may raise anything, SystemExit included
            if isinstance(exc, KeyboardInterrupt):
                raise
            failed[entry] = f"{type(exc).__name__}: {exc}"
            continue
        done.append(entry)
    return done, failed, time.monotonic() - t0


def _entries(value, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PreloadSettingError(f"{where} must be a list of module names (strings), not {value!r}")
    return [v.strip() for v in value if v.strip()]


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))
