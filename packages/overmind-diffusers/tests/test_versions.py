"""The diffusers adapter on every supported diffusers: what one version lacks is no fault.

diffusers 0.35 has no ``AutoPipelineForText2Audio`` (0.36 added it). A warning for it in every process would,
under ``OVERMIND_STRICT=1``, raise inside ``activate()`` and roll the whole diffusers adapter back: a warm
``vae=vae`` pipeline would then have only its text encoder (a transformers load) in Overmind's memory. A target the
installed diffusers does not define is skipped with a debug line, and every other target is patched, strictly.
"""
from __future__ import annotations

import logging
import warnings

import pytest

import overmind
from overmind import OvermindWarning
from overmind.adapter import is_patched, resolve


def _defined(where: str, attr: str) -> bool:
    try:
        return attr in vars(resolve(where))
    except (ImportError, AttributeError):
        return False


def test_every_target_this_diffusers_defines_is_patched_under_strict(monkeypatch, caplog):
    import diffusers
    import diffusers.pipelines.auto_pipeline  # noqa: F401  (its lazy targets are patched, or skipped, at activate)

    from overmind_diffusers import plugin

    monkeypatch.setenv("OVERMIND_STRICT", "1")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="overmind"):
        warnings.simplefilter("always")
        overmind.activate(strict=True)
    assert not [w for w in caught if issubclass(w.category, OvermindWarning)]
    defined = [s for s in plugin.SPECS if _defined(s.where, s.attr)]
    for spec in defined:
        assert is_patched(resolve(spec.where), spec.attr), f"{spec.where}.{spec.attr} is not patched"
    skipped = [s for s in plugin.SPECS if s not in defined]
    debug = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    for spec in skipped:
        assert f"{spec.where.replace(':', '.')}.{spec.attr} is not defined in this version" in debug
    has_text2audio = hasattr(diffusers.pipelines.auto_pipeline, "AutoPipelineForText2Audio")
    assert has_text2audio == (tuple(map(int, diffusers.__version__.split(".")[:2])) >= (0, 36))
    assert [s.where.rpartition(":")[2] for s in skipped] == ([] if has_text2audio else ["AutoPipelineForText2Audio"])


def _entries():
    return len(overmind.cache_info(processes=False).entries)


def test_dtype_spellings_are_keyed_as_the_installed_diffusers_reads_them(active, tmp_path):
    """diffusers 0.40 and later read ``dtype=`` and ``torch_dtype=`` as one argument; earlier ones know only
    ``torch_dtype=`` (a model rejects ``dtype=``, a pipeline ignores it). Neither reads ``"float16"`` as
    ``torch.float16``. A cached call answers each spelling as the plain call does, after the fp16 entry exists."""
    import diffusers
    import torch
    from diffusers import ControlNetModel, StableDiffusionPipeline

    from _support import tiny_models as tm
    from overmind_diffusers.arguments import reads_dtype

    net, ckpt = tm.build_controlnet(tmp_path / "cn", seed=1), tm.build_sd_pipeline(tmp_path / "sd")
    assert reads_dtype() == (tuple(map(int, diffusers.__version__.split(".")[:2])) >= (0, 40))
    assert ControlNetModel.from_pretrained(net, variant="fp16", torch_dtype=torch.float16).dtype == torch.float16
    assert StableDiffusionPipeline.from_pretrained(ckpt, torch_dtype=torch.float16).unet.dtype == torch.float16
    before = _entries()

    # A string is float32 to diffusers: a load of its own, never the fp16 entry.
    assert ControlNetModel.from_pretrained(net, variant="fp16", torch_dtype="float16").dtype == torch.float32
    assert _entries() == before + 1
    if reads_dtype():
        assert ControlNetModel.from_pretrained(net, variant="fp16", dtype=torch.float16).dtype == torch.float16
        assert StableDiffusionPipeline.from_pretrained(ckpt, dtype=torch.float16).unet.dtype == torch.float16
        assert _entries() == before + 1  # both hits on the torch_dtype= entries
        with pytest.raises(ValueError, match="both `dtype` and `torch_dtype`"):
            StableDiffusionPipeline.from_pretrained(ckpt, dtype=torch.float16, torch_dtype=torch.float16)
    else:
        with pytest.raises(TypeError, match="unexpected keyword argument 'dtype'"):
            ControlNetModel.from_pretrained(net, variant="fp16", dtype=torch.float16)
        assert StableDiffusionPipeline.from_pretrained(ckpt, dtype=torch.float16).unet.dtype == torch.float32


@pytest.fixture(autouse=True)
def _always_deactivated():
    yield
    overmind.deactivate()
