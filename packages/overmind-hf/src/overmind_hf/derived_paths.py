"""Where a Hugging Face load's result holds a path transformers or diffusers derived from the call's model path:
the places a hit writes as its own caller spelled the path (``overmind_derived_paths``; the core checks each value
and does the writing, :mod:`overmind.entries.path_spellings`).

- transformers keeps ``str(path)`` as the ``name_or_path`` of every ``PreTrainedModel`` in the module tree (a
  causal LM's inner model too) and as its config's ``_name_or_path``; a tokenizer keeps it as ``name_or_path``, in
  its ``init_kwargs``, and the files it found there as ``os.path.join(path, "vocab.txt")``, in ``init_kwargs`` and
  as attributes of the same names, unless the call named that file itself; a processor holds its tokenizer.
- diffusers keeps the path as given (a ``Path`` stays one) in the config of a model, scheduler or pipeline, a
  ``FrozenDict`` that holds ``_name_or_path`` both as an item and as an attribute; a pipeline loads each
  component from ``os.path.join(path, name)``, transformers' components among them.

Nothing else is named: a string that merely equals the path (``model_type`` of a folder named ``bert``) is not
the library's derivation. Classes are looked up in ``sys.modules``, never imported.
"""
from __future__ import annotations

import sys

from overmind.adapter import DerivedPath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

NAME = "name_or_path"  # transformers models and tokenizers
CONFIG_NAME = "_name_or_path"  # transformers configs, diffusers configs
# what a tokenizer's from_pretrained looks for in the folder besides its class's vocab_files_names
TOKENIZER_FILES = ("tokenizer_file", "tokenizer_config_file", "chat_template_file")
CHAT_TEMPLATE_FILE = "chat_template_"  # chat_template_<name>: a template file of the folder's additional_chat_templates

_CLASSES = {
    "module": ("torch.nn", "Module"),
    "model": ("transformers.modeling_utils", "PreTrainedModel"),
    "config": ("transformers.configuration_utils", "PretrainedConfig"),
    "tokenizer": ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase"),
    "processor": ("transformers.processing_utils", "ProcessorMixin"),
    "config_mixin": ("diffusers.configuration_utils", "ConfigMixin"),
    "pipeline": ("diffusers.pipelines.pipeline_utils", "DiffusionPipeline"),
}


def places(result: Any, argument: str, arguments: Mapping[str, Any]) -> list[DerivedPath]:
    """The places in ``result`` where the libraries keep a path derived from argument ``argument`` of the call."""
    return _Finder(argument, arguments).visit(result, ())


class _Finder:
    def __init__(self, argument: str, arguments: Mapping[str, Any]) -> None:
        self.argument, self.arguments = argument, arguments
        self.classes = {kind: _class(*where) for kind, where in _CLASSES.items()}
        self.found: list[DerivedPath] = []
        self.seen: set[int] = set()

    def _is(self, obj: Any, kind: str) -> bool:
        cls = self.classes[kind]
        return cls is not None and isinstance(obj, cls)

    def _add(self, steps: tuple, key: str, item: bool = False) -> None:
        self.found.append(DerivedPath(steps, key, self.argument, item))

    def visit(self, obj: Any, steps: tuple) -> list[DerivedPath]:
        if id(obj) in self.seen:
            return self.found
        self.seen.add(id(obj))
        if self._is(obj, "module"):
            for name, module in obj.named_modules():
                self._module(module, steps + _module_steps(name))
        elif self._is(obj, "tokenizer"):
            self._tokenizer(obj, steps)
        elif type(obj) in (tuple, list):  # (model, loading_info) of output_loading_info=True
            for i, part in enumerate(obj):
                self.visit(part, steps + (("item", i),))
        elif self._is(obj, "config_mixin") or self._is(obj, "processor"):
            if self._is(obj, "config_mixin"):
                self._config_mixin(obj, steps)
            if self._is(obj, "pipeline") or self._is(obj, "processor"):
                for name, part in list(_attributes(obj).items()):  # a pipeline's components, a processor's parts
                    self.visit(part, steps + (("attr", name),))
        return self.found

    def _module(self, module: Any, steps: tuple) -> None:
        if self._is(module, "model"):
            self._add(steps, NAME)
            config = _attributes(module).get("config")
            if self._is(config, "config") and id(config) not in self.seen:  # an inner model shares its config
                self.seen.add(id(config))
                self._add(steps + (("attr", "config"),), CONFIG_NAME)
        if self._is(module, "config_mixin"):
            self._config_mixin(module, steps)

    def _config_mixin(self, obj: Any, steps: tuple) -> None:
        config = steps + (("attr", "_internal_dict"),)
        self._add(config, CONFIG_NAME, item=True)
        self._add(config, CONFIG_NAME)  # a FrozenDict sets each of its items as an attribute too

    def _tokenizer(self, tokenizer: Any, steps: tuple) -> None:
        init_kwargs = steps + (("attr", "init_kwargs"),)
        self._add(steps, NAME)
        self._add(init_kwargs, NAME, item=True)
        found = set(getattr(type(tokenizer), "vocab_files_names", None) or ()) | set(TOKENIZER_FILES)
        named = _attributes(tokenizer).get("init_kwargs")
        found |= {k for k in (named if isinstance(named, dict) else ()) if str(k).startswith(CHAT_TEMPLATE_FILE)}
        for name in sorted(found, key=str):
            if self.arguments.get(name) is None:  # a file the call named itself is not found in the folder
                self._add(init_kwargs, name, item=True)
                self._add(steps, name)


def _class(module: str, name: str) -> type | None:
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


def _attributes(obj: Any) -> dict:
    attributes = getattr(obj, "__dict__", None)
    return attributes if isinstance(attributes, dict) else {}


def _module_steps(name: str) -> tuple:
    """The steps from a module to its submodule ``name`` (``"model.layers.0"``), through each ``_modules``."""
    return tuple(step for part in name.split(".") if part for step in (("attr", "_modules"), ("item", part)))
