"""Two nodes of a fleet on one machine, each with its own server and its own copy of the model files:
node B's first load of a tiny Stable Diffusion pipeline imports the entry node A built, through a real
S3-compatible store (SeaweedFS on loopback) and through a shared folder, and equals B's plain load in
everything the script reports (weights, classes, configs, the paths the pipeline holds, an image).
"""
from __future__ import annotations

import pytest

from _support.fleet_nodes import Node, copy_model
from _support.tiny_models import build_sd_pipeline

pytest.importorskip("diffusers")

# Runs in a fresh process of a node: loads the pipeline as a user does and reports what must match.
LOAD_PIPELINE = """
import hashlib, json, sys
import overmind
overmind.activate()
import torch
from diffusers import StableDiffusionPipeline
sys.path.insert(0, {support!r})
from _support.tiny_models import state_digest
from overmind.testing import report

{load}
parts = {{}}
for name, part in sorted(pipe.components.items()):
    if isinstance(part, torch.nn.Module):
        config = part.config.to_dict() if hasattr(part.config, "to_dict") else dict(part.config)
        parts[name] = [type(part).__name__, state_digest(part), json.dumps(config, default=str, sort_keys=True)]
    elif hasattr(part, "name_or_path"):  # the tokenizer
        parts[name] = [type(part).__name__, part.name_or_path, part("a red cat").input_ids,
                       sorted((k, str(v)) for k, v in part.init_kwargs.items())]
    else:
        parts[name] = [type(part).__name__, repr(part)]
image = pipe("a red cat", num_inference_steps=2, generator=torch.Generator().manual_seed(0),
             output_type="np").images[0]
report({{"parts": parts, "pipeline": repr(pipe), "config": json.dumps(dict(pipe.config), default=str),
        "image": hashlib.sha256(image.tobytes()).hexdigest()}})
"""


PIPELINE = "pipe = StableDiffusionPipeline.from_pretrained({path!r})"
# a component from an earlier load, passed in: its entry's portable key stands for it in the pipeline's
WITH_VAE = ("from diffusers import AutoencoderKL\n"
            "vae = AutoencoderKL.from_pretrained({path!r}, subfolder='vae')\n"
            "pipe = StableDiffusionPipeline.from_pretrained({path!r}, vae=vae)")


def _script(path, load: str = PIPELINE) -> str:
    import _support

    support = str(__import__("pathlib").Path(_support.__file__).parent.parent)
    return LOAD_PIPELINE.format(path=str(path), support=support, load=load.format(path=str(path)))


def _share(tmp_path, fleet_url: str, store_env: dict | None = None, load: str = PIPELINE) -> dict:
    source = build_sd_pipeline(tmp_path / "built")
    a, b = Node.pair(tmp_path, fleet_url, store_env)
    try:
        path_a, path_b = copy_model(source, tmp_path / "a" / "sd"), copy_model(source, tmp_path / "b" / "sd")
        loaded_a = a.run(_script(path_a, load))
        a.wait_uploads(1)
        plain_b = b.run_plain(_script(path_b, load))
        loaded_b = b.run(_script(path_b, load))
        st = b.status()
        assert st["fleet_imports"] >= 1, f"node B did not import from the store: {st}"
        assert st["publishes"] == 0, "node B ran the loader and published instead of importing"
        # the checkpoint files the entry references are node B's own copies, not downloaded bytes
        assert st["files"] >= 1 and st["file_bytes"] > 0
        assert loaded_b == plain_b
        assert loaded_a["image"] == plain_b["image"]  # the same pipeline on both nodes
        again_b = b.run(_script(path_b, load))  # and node B's next process hits its own server
        assert again_b == plain_b
        assert b.status()["hits"] >= 1
        return st
    finally:
        a.stop()
        b.stop()


@pytest.mark.long(60)
def test_node_b_imports_the_pipeline_node_a_built_through_s3(tmp_path, s3_url, seaweed):
    _share(tmp_path, s3_url, seaweed.env)


@pytest.mark.long(50)
def test_node_b_imports_the_pipeline_node_a_built_through_a_shared_folder(tmp_path):
    _share(tmp_path, "file://" + str(tmp_path / "store"))


@pytest.mark.long(50)
def test_a_pipeline_given_a_component_of_an_earlier_load_is_shared_too(tmp_path):
    st = _share(tmp_path, "file://" + str(tmp_path / "store"), load=WITH_VAE)
    assert st["fleet_imports"] == 2  # the VAE and the pipeline given it
