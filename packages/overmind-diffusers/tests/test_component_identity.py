"""``from_pretrained(path, vae=vae, controlnet=[edge, depth])`` holds the very objects it was given, as plain
diffusers does: ``pipe.vae is vae`` and ``pipe.controlnet.nets[i] is nets[i]``, in the publishing process and in
a fresh one served from the cache, and the pipeline's entry holds none of their bytes."""
from __future__ import annotations

import pytest

SCRIPT = '''
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline

overmind.activate()


def components():
    vae = AutoencoderKL.from_pretrained(P["ckpt"], subfolder="vae", torch_dtype=torch.float16)
    nets = [ControlNetModel.from_pretrained(P[name], torch_dtype=torch.float16, variant="fp16")
            for name in ("edge", "depth")]
    return vae, nets


def pipeline(vae, nets):
    return StableDiffusionControlNetPipeline.from_pretrained(
        P["ckpt"], vae=vae, controlnet=nets, torch_dtype=torch.float16, safety_checker=None)


def render(pipe):
    image = tm.sd_control_image(3)
    out = pipe(tm.SD_PROMPT, image=[image, image], num_inference_steps=2, output_type="pt",
               generator=torch.Generator().manual_seed(7)).images
    return tm.tensor_digest(out)


def entries(suffix):
    return [e.to_json() for e in overmind.cache_info(processes=False).entries if e.loader.endswith(suffix)]


def skeleton_classes(entry):
    """The classes and functions the entry's skeleton refers to by name (its pickle's global references):
    the class of every object pickled in it is among them."""
    import pickletools
    from overmind.testing import entry_skeleton

    skeleton = entry_skeleton(entry["key"])
    found, memo, pushed = set(), {}, []
    for op, arg, _ in pickletools.genops(skeleton):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            pushed.append(arg)
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(int(arg)))
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name == "STACK_GLOBAL":
            found.add(f"{pushed[-2]}.{pushed[-1]}")
        elif op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name not in ("BINPUT", "LONG_BINPUT", "PUT", "FRAME", "PROTO"):
            pushed.append(None)  # anything else leaves a non-name on the stack
    return sorted(found)


vae, nets = components()
before = server_state()
pipe = pipeline(vae, nets)
after = server_state()
[pipe_entry] = entries("StableDiffusionControlNetPipeline.from_pretrained")
[vae_entry] = entries("AutoencoderKL.from_pretrained")
net_entries = entries("ControlNetModel.from_pretrained")
got = {
    "vae_is": pipe.vae is vae, "nets_are": [a is b for a, b in zip(pipe.controlnet.nets, nets)],
    "n_nets": len(pipe.controlnet.nets), "pipe_hit": after["hits"] - before["hits"],
    "pipe_deps": pipe_entry["deps"], "pipe_classes": skeleton_classes(pipe_entry),
    "component_entries": [vae_entry["entry_id"]] + [e["entry_id"] for e in net_entries],
    "vae_weights": weight_entries(vae), "cached": render(pipe),
}
overmind.deactivate()
got["plain"] = render(pipeline(*components()))
report(got)
'''


@pytest.mark.long(40)  # seconds on a CI machine: conftest.py runs it early
def test_pipeline_holds_the_given_vae_and_controlnets_in_both_processes(fresh):
    first = fresh(SCRIPT)
    second = fresh(SCRIPT)
    assert second["pipe_hit"] >= 1, "the second process must be served the pipeline from the cache"
    for got in (first, second):
        assert got["vae_is"], "pipe.vae is not the vae passed in"
        assert got["n_nets"] == 2 and got["nets_are"] == [True, True], "pipe.controlnet.nets are not the nets passed"
        assert got["cached"] == got["plain"]
        # The pipeline entry holds neither the vae's and ControlNets' bytes (not even as references to their
        # entries) nor their skeletons: no object of those classes is pickled in it, as the unet (its own load) is.
        assert not set(got["pipe_deps"]) & set(got["component_entries"]), got["pipe_deps"]
        names = {c.rsplit(".", 1)[-1] for c in got["pipe_classes"]}
        assert {"UNet2DConditionModel", "MultiControlNetModel"} <= names, got["pipe_classes"]
        assert not {"AutoencoderKL", "ControlNetModel"} & names, "the vae or a ControlNet was pickled into the pipeline"
        assert len(got["vae_weights"]) == 1 and None not in got["vae_weights"]
    assert second["cached"] == first["plain"] == second["plain"]
