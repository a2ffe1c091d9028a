"""The timm adapter's hooks: ``timm.create_model`` and ``timm.models.load_state_dict`` are cached.

``create_model`` builds the network at random before it loads any weights: the core makes such an entry the
variant of the random generators' state before the call and puts them where the plain call leaves them, so a
seeded program (and torch's fixed default seed) hits, and its next draws are the plain run's. The key holds the
arguments, the files they name (a ``pretrained_cfg_overlay`` or ``pretrained_cfg`` ``file``, a
``checkpoint_path``: fingerprinted by the core as any existing path is) and, for ``local-dir:`` models, the
folder. Weights that come from the Hugging Face Hub or a URL are not read from a file the call names, so such a
call runs plain (logged at debug).

``load_checkpoint(model, path)`` changes the model it is given, which a hit could not do to the caller's
model: the adapter caches what it reads instead, ``load_state_dict(path)``, which it calls (a state dict is a
function of the file), and the copy into the model runs as in plain timm. Inside ``create_model`` the state dict
is not cached on its own: the model's entry already holds those weights.
"""
from __future__ import annotations

import sys
from typing import Any

from overmind.adapter import Function, SelfCheck, Uncacheable, collect, fingerprint, get_original, hookimpl, owns

ADAPTER = "timm"
CREATE = (Function("timm.models._factory:create_model"),)
STATE_DICT = (Function("timm.models._helpers:load_state_dict"),)
SPECS = CREATE + STATE_DICT
_HUB_PREFIXES = ("hf-hub", "hf_hub")


@hookimpl
def overmind_patch_targets():
    return collect(ADAPTER, SPECS)


@hookimpl
def overmind_key_parts(loader: Any, arguments: dict[str, Any]) -> Any:
    """``local-dir:`` models by their folder; a call whose weights are not in a file it names is not cached."""
    if owns(loader, CREATE):
        return _create_model_parts(arguments)
    if owns(loader, STATE_DICT) and _inside_create_model():
        raise Uncacheable("read inside timm.create_model, whose own entry holds these weights")
    return None


def _create_model_parts(arguments: dict[str, Any]) -> Any:
    name = arguments.get("model_name")
    source, sep, location = name.partition(":") if isinstance(name, str) else ("", "", "")
    if sep and source == "local-dir":
        return [("timm local-dir", fingerprint(location))]
    if sep and source in _HUB_PREFIXES:
        raise _not_from_a_file(name, "weights and configuration from the Hugging Face Hub")
    if not arguments.get("pretrained"):
        return None  # built at random (a variant of the generators' state), then checkpoint_path if any
    cfg = _as_dict(arguments.get("pretrained_cfg"))
    cfg.update(_as_dict(arguments.get("pretrained_cfg_overlay")))
    if cfg.get("source") in _HUB_PREFIXES or not (cfg.get("state_dict") is not None or cfg.get("file")):
        raise _not_from_a_file(name, "pretrained weights from the Hugging Face Hub or a URL")
    return None


def _not_from_a_file(name: Any, what: str) -> Exception:
    return Uncacheable(f"{name!r}: {what}, not from a file the call names; pass "
                       f"pretrained_cfg_overlay=dict(file=PATH) to cache it")


def _as_dict(cfg: Any) -> dict:
    if isinstance(cfg, dict):
        return dict(cfg)
    if cfg is None or isinstance(cfg, str):  # a tag of the registry's configurations: the Hub or a URL
        return {}
    fields = getattr(cfg, "__dataclass_fields__", None)  # timm's PretrainedCfg
    return {name: getattr(cfg, name, None) for name in fields} if fields else {}


def _inside_create_model() -> bool:
    """Whether timm's own create_model is on this thread's stack (its entry holds what it reads)."""
    module = sys.modules.get("timm.models._factory")
    if module is None:
        return False
    original = get_original(module, "create_model")
    code = getattr(original, "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


@hookimpl
def overmind_self_check() -> SelfCheck:
    """On a timm release newer than the tested range: the parameters the key reads, and a tiny ResNet built at
    random (the generators are put back) that must come back from the entry codec equal."""
    return SelfCheck(
        relies_on={"create_model": ("model_name", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay",
                                    "checkpoint_path"),
                   "load_state_dict": ("checkpoint_path",)},
        sample=_sample)


def _sample() -> Any:
    import timm

    return timm.create_model("resnet10t", num_classes=3)
