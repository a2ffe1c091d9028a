"""The AutoPipeline classes are patched when the user imports them, not imported by ``activate()``: their
module imports every pipeline of diffusers (0.7 s and 21 MiB in each process). Checked in fresh processes:
the blog's imports leave ``auto_pipeline`` unimported; importing it afterwards patches its loaders, a load
through them publishes, hits in the next process and equals the plain load; ``deactivate()`` puts the originals
back, and after it an import patches nothing."""
from __future__ import annotations

LAZY = '''
from overmind.adapter import is_patched

overmind.activate()
import diffusers
from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline  # the blog's imports

blog_imported_auto = "diffusers.pipelines.auto_pipeline" in sys.modules
from diffusers import AutoPipelineForText2Image, AutoPipelineForImage2Image

patched = [is_patched(c, "from_pretrained") for c in (AutoPipelineForText2Image, AutoPipelineForImage2Image)]


def digest(pipe):
    out = pipe(tm.SD_PROMPT, num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(3)).images
    return [type(pipe).__name__, tm.tensor_digest(out)]


pipe, new_entries, hits = counted_load(lambda: AutoPipelineForText2Image.from_pretrained(P["ckpt"]))
cached = digest(pipe)
overmind.deactivate()
original = vars(AutoPipelineForText2Image)["from_pretrained"]
restored = (not is_patched(AutoPipelineForText2Image, "from_pretrained")
            and original.__func__.__qualname__ == "AutoPipelineForText2Image.from_pretrained"
            and original.__func__.__module__ == "diffusers.pipelines.auto_pipeline")
plain = digest(AutoPipelineForText2Image.from_pretrained(P["ckpt"]))
report({"blog_imported_auto": blog_imported_auto, "patched": patched, "new_entries": new_entries, "hits": hits,
        "cached": cached, "plain": plain, "restored": restored})
'''

DEACTIVATED_FIRST = '''
from overmind.adapter import is_patched

overmind.activate()
import diffusers
from diffusers import AutoencoderKL

overmind.deactivate()
from diffusers import AutoPipelineForText2Image

report({"patched": is_patched(AutoPipelineForText2Image, "from_pretrained"),
        "model_patched": is_patched(diffusers.ModelMixin, "from_pretrained")})
'''


def test_autopipelines_are_patched_when_imported_and_cache_as_plain(fresh):
    first = fresh(LAZY)
    assert first["blog_imported_auto"] is False
    assert first["patched"] == [True, True]
    assert first["new_entries"] >= 1 and first["cached"] == first["plain"] and first["restored"]

    second = fresh(LAZY)
    assert second["new_entries"] == 0 and second["hits"] >= 1
    assert second["cached"] == second["plain"] == first["plain"] and second["restored"]


def test_after_deactivate_importing_them_patches_nothing(fresh):
    got = fresh(DEACTIVATED_FIRST)
    assert got == {"patched": False, "model_patched": False}
