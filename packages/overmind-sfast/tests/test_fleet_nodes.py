"""Two nodes of a fleet on one machine, each with its own server and its own copy of a tiny SD pipeline:
node B's first load of the stable-fast compiled pipeline imports the entry node A built, through a shared
folder, without building or tracing, and renders the image B's plain load renders, with the same
components and parameter types.
"""
from __future__ import annotations

import os

import pytest

from _support.fleet_nodes import Node, copy_model

pytest.importorskip("sfast", reason="stable-fast is not installed (scripts/setup installs it from ../shared/wheels)")

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # overmind_sfast_testlib is importable from it

# Runs in a fresh process of a node: the builder through the cache (with Overmind off, plain), one render.
LOAD_AND_RENDER = """
import hashlib, sys
sys.path.insert(0, {tests_dir!r})
import overmind
import torch
from overmind.testing import report
from overmind_sfast.sharing import tensor_attributes
overmind.activate()
from overmind_sfast_testlib import pipelines as sp

counter = sp.TraceCounter()
with counter.installed():
    pipe = overmind.load(sp.build, {ckpt!r})
    image = sp.render(pipe)
parts = {{name: [type(part).__name__,
                 sorted({{f"{{type(p).__name__}} {{p.dtype}}" for p in part.parameters()}})
                 if isinstance(part, torch.nn.Module) else None]
          for name, part in sorted(pipe.components.items())}}
(helper,) = pipe.unet.forward._cached.values()
# the traced module as its Python wrapper lists it (parameters(), named_modules()) and its weights as
# TorchScript holds them (the wrapper stable-fast's freeze returns lists no submodules)
report({{"builds": sp.builds(), "traces": counter.calls, "image": hashlib.sha256(image.tobytes()).hexdigest(),
         "shape": list(image.shape), "parts": parts, "traced": type(helper.module).__name__,
         "traced_parameters": [f"{{name}} {{type(p).__name__}} {{p.dtype}} {{list(p.shape)}}"
                               for name, p in helper.module.named_parameters()],
         "traced_modules": [name for name, _ in helper.module.named_modules()],
         "traced_tensors": sorted(f"{{name}} {{type(t).__name__}} {{t.dtype}} {{list(t.shape)}}"
                                  for name, t in tensor_attributes(helper.module._c))}})
"""


def _script(ckpt) -> str:
    return LOAD_AND_RENDER.format(tests_dir=TESTS_DIR, ckpt=str(ckpt))


@pytest.mark.long(70)
def test_node_b_imports_the_compiled_pipeline_node_a_built_through_a_shared_folder(tmp_path, sd_ckpt):
    a, b = Node.pair(tmp_path, "file://" + str(tmp_path / "store"), {"OVERMIND_STRICT": "1"})
    try:
        path_a, path_b = copy_model(sd_ckpt, tmp_path / "a" / "sd"), copy_model(sd_ckpt, tmp_path / "b" / "sd")
        loaded_a = a.run(_script(path_a), timeout=900)
        assert loaded_a["builds"] == 1 and loaded_a["traces"] >= 3
        a.wait_uploads(1)
        plain_b = b.run_plain(_script(path_b), timeout=900)
        assert plain_b["builds"] == 1 and plain_b["traces"] >= 3
        loaded_b = b.run(_script(path_b), timeout=900)
        st = b.status()
        assert st["fleet_imports"] >= 1, f"node B did not import from the store: {st}"
        assert st["publishes"] == 0, "node B ran the loader and published instead of importing"
        assert (loaded_b["builds"], loaded_b["traces"]) == (0, 0)  # B neither built nor traced
        assert loaded_b["traced_tensors"]  # the traced UNet's weights, compared below
        assert loaded_b == {**plain_b, "builds": 0, "traces": 0}
        assert loaded_a["image"] == plain_b["image"]  # the same pipeline on both nodes
    finally:
        a.stop()
        b.stop()
