"""The blog's four calls warn in a hit as in the plain call (diffusers 0.36+ deprecates ``torch_dtype`` with a
``FutureWarning``): three fresh processes, plain, the miss and a hit, show the same warnings, at the same file
and line, as often (``overmind.loader_warnings``)."""
from __future__ import annotations

import importlib.metadata

from packaging.version import Version

SCRIPT = '''
import warnings

seen = []
warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append(
    [c.__name__, str(m), "<script>" if f == __file__ else f, n])
overmind.activate()
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline

vae = AutoencoderKL.from_pretrained(P["ckpt"], subfolder="vae", torch_dtype=torch.float16)
depth = ControlNetModel.from_pretrained(P["depth"], torch_dtype=torch.float16, variant="fp16")
edge = ControlNetModel.from_pretrained(P["edge"], torch_dtype=torch.float16, variant="fp16")
pipe = StableDiffusionControlNetPipeline.from_pretrained(P["ckpt"], vae=vae, controlnet=[edge, depth],
                                                         torch_dtype=torch.float16, safety_checker=None)
report({"seen": seen, "entries": len(overmind.cache_info().entries)})
'''


def test_plain_miss_and_hit_show_the_same_warnings(fresh):
    plain = fresh(SCRIPT, OVERMIND_DISABLE="1")
    miss = fresh(SCRIPT)
    hit = fresh(SCRIPT)
    assert miss["seen"] == plain["seen"]
    assert hit["seen"] == plain["seen"]
    assert hit["entries"] == miss["entries"] >= 4  # cached, and the hit published nothing new
    if Version(importlib.metadata.version("diffusers")) >= Version("0.36"):
        assert any(c == "FutureWarning" and "torch_dtype" in m for c, m, _f, _n in plain["seen"]), plain["seen"]
