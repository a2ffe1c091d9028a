"""The blog's four calls warn and log in a hit as in the plain call (diffusers 0.36+ deprecates ``torch_dtype``
with a ``FutureWarning``; diffusers logs that the safety checker is off): three fresh processes, plain, the miss
and a hit, show the same warnings and log records, at the same file and line, as often, in the same order
(``overmind.loading.replay.loader_warnings``, ``overmind.loading.replay.loader_logs``)."""
from __future__ import annotations

import importlib.metadata

import pytest
from packaging.version import Version

SCRIPT = '''
import logging, warnings

seen = []
warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append(
    [c.__name__, str(m), "<script>" if f == __file__ else f, n])


class Seen(logging.Handler):
    def emit(self, record):
        if not record.name.startswith("overmind"):
            seen.append(["log", record.name, record.levelname, record.getMessage(), record.pathname, record.lineno])


for name in ("", "diffusers", "transformers"):  # the libraries' loggers do not propagate to the root
    logging.getLogger(name).addHandler(Seen())
overmind.activate()
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline

vae = AutoencoderKL.from_pretrained(P["ckpt"], subfolder="vae", torch_dtype=torch.float16)
depth = ControlNetModel.from_pretrained(P["depth"], torch_dtype=torch.float16, variant="fp16")
edge = ControlNetModel.from_pretrained(P["edge"], torch_dtype=torch.float16, variant="fp16")
# requires_safety_checker=True: what the full blog checkpoint's config says (the tiny one's says False)
pipe = StableDiffusionControlNetPipeline.from_pretrained(P["ckpt"], vae=vae, controlnet=[edge, depth],
                                                         torch_dtype=torch.float16, safety_checker=None,
                                                         requires_safety_checker=True)
report({"seen": seen, "entries": len(overmind.cache_info().entries)})
'''


@pytest.mark.long(55)  # seconds on a CI machine: conftest.py runs it early
def test_plain_miss_and_hit_show_the_same_warnings(fresh):
    plain = fresh(SCRIPT, OVERMIND_DISABLE="1")
    miss = fresh(SCRIPT)
    hit = fresh(SCRIPT)
    assert miss["seen"] == plain["seen"]
    assert hit["seen"] == plain["seen"]
    assert hit["entries"] == miss["entries"] >= 4  # cached, and the hit published nothing new
    if Version(importlib.metadata.version("diffusers")) >= Version("0.36"):
        assert any(c == "FutureWarning" and "torch_dtype" in m for c, m, *_ in plain["seen"]), plain["seen"]
    # diffusers logs (not warns) that the safety checker is off, inside the pipeline's loader: the hit logs it too
    assert any(e[0] == "log" and e[1].startswith("diffusers.") and "safety checker" in e[3] for e in plain["seen"])
