"""The issue's scenario with a real server and fresh processes: build once, then every process gets the
compiled pipeline from the cache, ready to run, without tracing."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("sfast", reason="stable-fast is not installed (scripts/setup installs it from ../shared/wheels)")

from overmind.testing import run_fresh  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # overmind_sfast_testlib is importable from it

# Runs in a fresh interpreter: loads the builder through the cache, renders, reports what happened.
LOAD_AND_RENDER = """
import hashlib, sys, time, warnings
sys.path.insert(0, {tests_dir!r})
import overmind
from overmind.testing import overmind_mapped, report
from overmind_sfast.sharing import tensor_attributes
if {activate!r}:
    overmind.activate()
from overmind_sfast_testlib import pipelines as sp

counter = sp.TraceCounter()
with counter.installed(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    start = time.perf_counter()
    pipe = overmind.load(sp.build, {ckpt!r})
    loaded_s = time.perf_counter() - start
    image = sp.render(pipe)
(helper,) = pipe.unet.forward._cached.values()
report({{
    "builds": sp.builds(),
    "traces": counter.calls,
    "image": hashlib.sha256(image.tobytes()).hexdigest(),
    "shape": list(image.shape),
    "unet_mapped": overmind_mapped(pipe.unet.conv_in.weight.data_ptr()),
    "traced_mapped": all(overmind_mapped(t.data_ptr()) for _, t in tensor_attributes(helper.module._c)),
    # the traced UNet as Python code sees it: what its wrapper lists, not only what TorchScript holds
    "traced_view": {{
        "parameters": [[n, type(p).__name__, str(p.dtype), list(p.shape)]
                       for n, p in helper.module.named_parameters()],
        "buffers": [[n, type(b).__name__, str(b.dtype), list(b.shape)] for n, b in helper.module.named_buffers()],
        "modules": [n for n, _ in helper.module.named_modules()],
    }},
    "warnings": [str(w.message) for w in caught if "overmind" in str(w.message)],
    "loaded_s": loaded_s,
}})
"""


def load_and_render(ckpt, activate=True, strict=True):
    script = LOAD_AND_RENDER.format(tests_dir=TESTS_DIR, ckpt=str(ckpt), activate=activate)
    return run_fresh(script, env={"OVERMIND_STRICT": "1" if strict else "0"}, timeout=900)


@pytest.mark.long(62)  # seconds on a CI machine: conftest.py runs it early
def test_second_process_gets_the_compiled_pipeline_without_tracing(overmind_runtime, sd_ckpt):
    first = load_and_render(sd_ckpt)
    assert first["builds"] == 1 and first["traces"] >= 3  # UNet, text encoder and VAE decoder parts
    assert first["shape"] == [1, 64, 64, 3]

    second = load_and_render(sd_ckpt)
    assert second["builds"] == 0
    assert second["traces"] == 0
    assert second["image"] == first["image"]
    assert second["traced_view"] == first["traced_view"]
    assert second["unet_mapped"] and second["traced_mapped"]  # weights shared, not copied

    # A process that never calls activate() still gets a working pipeline: nothing it runs needs a patch.
    third = load_and_render(sd_ckpt, activate=False)
    assert (third["builds"], third["traces"], third["image"], third["traced_view"]) == \
        (0, 0, first["image"], first["traced_view"])


# The builder compiles in a process where overmind-sfast is not active: the pipeline cannot be cached.
COMPILED_BEFORE_ACTIVATE = """
import sys, warnings
sys.path.insert(0, {tests_dir!r})
import overmind
from overmind.testing import report
from overmind_sfast_testlib import pipelines as sp

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pipe = overmind.load(sp.build, {ckpt!r})
    image = sp.render(pipe)
report({{"builds": sp.builds(), "shape": list(image.shape),
         "warnings": [str(w.message) for w in caught if "overmind" in str(w.message)]}})
"""


def test_compiled_without_activate_falls_back_with_a_warning_that_says_what_to_do(overmind_runtime, sd_ckpt):
    script = COMPILED_BEFORE_ACTIVATE.format(tests_dir=TESTS_DIR, ckpt=str(sd_ckpt))
    got = run_fresh(script, env={"OVERMIND_STRICT": "0"}, timeout=900)
    assert got["builds"] == 1 and got["shape"] == [1, 64, 64, 3]  # the user's pipeline, working
    (warning,) = [w for w in got["warnings"] if "could not cache" in w]
    assert "overmind-sfast" in warning and "overmind.activate() before compiling" in warning
