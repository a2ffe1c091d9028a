"""Every patched diffusers entry point, loaded in one fresh process (publishes) and again in a second fresh
process (must hit), compared with a plain load done in that second process after ``overmind.deactivate()``."""
from __future__ import annotations

import shutil

import pytest

ENTRY_POINTS = '''
import diffusers
from diffusers import (AutoencoderKL, AutoPipelineForText2Image, ControlNetModel, DDIMScheduler, DiffusionPipeline,
                       PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel)
from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel
from diffusers.schedulers.scheduling_utils import SchedulerMixin

overmind.activate()


def outputs(obj):
    """What obj produces on fixed inputs, as digests (bitwise comparison)."""
    if isinstance(obj, DiffusionPipeline):
        gen = torch.Generator().manual_seed(11)
        if type(obj).__module__.startswith("diffusers_modules"):
            out = obj(tm.SD_PROMPT, num_inference_steps=2, generator=gen)
        else:
            out = obj(tm.SD_PROMPT, num_inference_steps=2, output_type="pt", generator=gen).images
        return [type(obj).__module__ + "." + type(obj).__qualname__, type(obj.scheduler).__name__, tm.tensor_digest(out)]
    if isinstance(obj, torch.nn.Module):
        return [type(obj).__name__, tm.state_digest(obj), str(obj.dtype), str(obj.device),
                str(getattr(obj, "hf_device_map", None))]
    if isinstance(obj, SchedulerMixin):
        obj.set_timesteps(5)
        config = dict(obj.config)
        config["_use_default_values"] = sorted(config.get("_use_default_values", []))  # filled from a set
        return [type(obj).__name__, json.dumps(config, sort_keys=True, default=str), tm.tensor_digest(obj.timesteps)]
    raise AssertionError(f"no output for {type(obj)}")


LOADS = {
    "DiffusionPipeline.from_pretrained": lambda: DiffusionPipeline.from_pretrained(P["ckpt"]),
    "AutoPipelineForText2Image.from_pretrained": lambda: AutoPipelineForText2Image.from_pretrained(P["ckpt"]),
    "StableDiffusionPipeline scheduler=DDIM": lambda: StableDiffusionPipeline.from_pretrained(
        P["ckpt"], scheduler=DDIMScheduler.from_pretrained(P["ckpt"], subfolder="scheduler")),
    "StableDiffusionPipeline scheduler=DDIM.from_config": lambda: StableDiffusionPipeline.from_pretrained(
        P["ckpt"], scheduler=DDIMScheduler.from_config(PNDMScheduler.load_config(P["ckpt"], subfolder="scheduler"))),
    "custom_pipeline": lambda: DiffusionPipeline.from_pretrained(P["ckpt"], custom_pipeline=P["custom"],
                                                                 trust_remote_code=True),
    "UNet2DConditionModel.from_pretrained": lambda: UNet2DConditionModel.from_pretrained(P["ckpt"], subfolder="unet"),
    "diffusers.AutoModel.from_pretrained": lambda: diffusers.AutoModel.from_pretrained(P["ckpt"], subfolder="unet"),
    "ControlNetModel torch_dtype=float16": lambda: ControlNetModel.from_pretrained(
        P["edge"], torch_dtype=torch.float16, variant="fp16"),
    "ControlNetModel device_map=cpu": lambda: ControlNetModel.from_pretrained(P["depth"], variant="fp16",
                                                                              device_map="cpu"),
    "MultiControlNetModel.from_pretrained": lambda: MultiControlNetModel.from_pretrained(P["multi"]),
    "AutoencoderKL.from_single_file": lambda: AutoencoderKL.from_single_file(P["vae_file"], config=P["ckpt"],
                                                                             subfolder="vae"),
    "PNDMScheduler.from_pretrained": lambda: PNDMScheduler.from_pretrained(P["ckpt"], subfolder="scheduler"),
    "DDIMScheduler.from_pretrained": lambda: DDIMScheduler.from_pretrained(P["ckpt"], subfolder="scheduler"),
}
if tuple(map(int, diffusers.__version__.split(".")[:2])) >= (0, 40):  # dtype=: diffusers' spelling since 0.40
    LOADS["ControlNetModel dtype=float16"] = lambda: ControlNetModel.from_pretrained(P["edge"], dtype=torch.float16,
                                                                                     variant="fp16")
cached = {}
modules_before = sorted(m for m in sys.modules if m.startswith("diffusers_modules"))
for name, load in LOADS.items():
    obj, new_entries, hits = counted_load(load)
    cached[name] = {"outputs": outputs(obj), "new_entries": new_entries, "hits": hits,
                    "unmapped": isinstance(obj, torch.nn.Module) and None in weight_entries(obj)}
custom_in_own_cache = os.path.exists(os.path.join(os.environ["HF_MODULES_CACHE"], "diffusers_modules"))
overmind.deactivate()
# Compared as loaded: a cached storage keeps the plain load's alignment (a file reference is the plain mapping, a copy
# keeps the address modulo 64, shm/placer.py), so outputs are bitwise the plain ones; the weights themselves are
# compared through the state digests of the model entries.
plain = {name: outputs(load()) for name, load in LOADS.items()}
report({"cached": cached, "plain": plain, "modules_before": modules_before, "custom_in_own_cache": custom_in_own_cache})
'''


@pytest.mark.long(51)  # seconds on a CI machine: conftest.py runs it early
def test_every_entry_point_served_in_a_fresh_process_equals_plain(fresh, tmp_path):
    first_modules = tmp_path / "first-modules"
    first = fresh(ENTRY_POINTS, HF_MODULES_CACHE=str(first_modules))
    # (Every output of a cached load, pipelines included, is compared bitwise with a plain load's.)
    for name, got in first["cached"].items():
        assert got["outputs"] == first["plain"][name], f"{name}: first (publishing) load differs from a plain load"
    assert first["cached"]["ControlNetModel torch_dtype=float16"]["new_entries"] == 1
    if "ControlNetModel dtype=float16" in first["cached"]:  # diffusers >= 0.40 (test_versions.py: both spellings)
        assert first["cached"]["ControlNetModel dtype=float16"]["new_entries"] == 0  # one entry for both spellings
    assert first["custom_in_own_cache"]
    shutil.rmtree(first_modules)  # the second process can get the custom pipeline's code only from the entry

    second = fresh(ENTRY_POINTS)
    for name, got in second["cached"].items():
        assert got["new_entries"] == 0, f"{name}: the second process loaded it again instead of hitting"
        assert got["hits"] >= 1, f"{name}: no hit in the second process"
        assert not got["unmapped"], f"{name}: weights outside Overmind's shared memory"
        assert got["outputs"] == second["plain"][name], f"{name}: cached object differs from a plain load"
    assert second["modules_before"] == [] and not second["custom_in_own_cache"]
    assert second["cached"]["custom_pipeline"]["outputs"][0] == "diffusers_modules.local.pipeline.TinyCustomPipeline"
    assert second["cached"]["StableDiffusionPipeline scheduler=DDIM.from_config"]["outputs"][1] == "DDIMScheduler"
    assert second["cached"]["ControlNetModel device_map=cpu"]["outputs"][3] == "cpu"
    assert second["cached"].get("ControlNetModel dtype=float16", {"outputs": [0, 0, "torch.float16"]})["outputs"][2] \
        == second["cached"]["ControlNetModel torch_dtype=float16"]["outputs"][2] == "torch.float16"
