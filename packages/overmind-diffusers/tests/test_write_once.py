"""An fp32 pipeline loaded as fp16, through the load arena (converted tensors written once).

The tiny checkpoint's tensors are small, so the arena's threshold is lowered to one page in the child: the
path is the one a full-size UNet's 1 MiB-and-up tensors take. Cold and warm processes must give exactly
what the plain load gives: every weight bitwise, dtypes, and the same image.
"""
from __future__ import annotations

PIPE = '''
from diffusers import StableDiffusionPipeline
from overmind.testing import set_thresholds

set_thresholds(arena=4096)
overmind.activate()


def load():
    return StableDiffusionPipeline.from_pretrained(P["ckpt"], torch_dtype=torch.float16, safety_checker=None)


def digests(pipe):
    return {name: tm.state_digest(getattr(pipe, name)) for name in ("unet", "vae", "text_encoder")}


def render(pipe):
    out = pipe(tm.SD_PROMPT, num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(3))
    return tm.tensor_digest(out.images)


before = server_state()
pipe = load()
after = server_state()
written = {e.loader.rsplit(".", 2)[-2]: e.meta.get("written_once", 0) for e in overmind.cache_info(processes=False).entries}
cached = {"weights": digests(pipe), "image": render(pipe), "dtype": str(pipe.unet.dtype),
          "classes": [type(getattr(pipe, n)).__name__ for n in ("unet", "vae", "text_encoder", "tokenizer")]}
overmind.deactivate()
plain_pipe = load()
plain = {"weights": digests(plain_pipe), "image": render(plain_pipe), "dtype": str(plain_pipe.unet.dtype),
         "classes": [type(getattr(plain_pipe, n)).__name__ for n in ("unet", "vae", "text_encoder", "tokenizer")]}
report({"hits": after["hits"] - before["hits"], "written": written, "cached": cached, "plain": plain})
'''


def test_a_converted_pipeline_is_written_once_and_is_the_plain_one(fresh):
    cold = fresh(PIPE, OVERMIND_ZEROCOPY="c")
    assert cold["cached"] == cold["plain"]
    assert cold["plain"]["dtype"] == "torch.float16"
    # diffusers' components converted their weights straight into their entries. (transformers 5 converts on
    # a thread pool of its own, whose allocations are not placed: the text encoder's are copied as before.)
    for component in ("UNet2DConditionModel", "AutoencoderKL"):
        assert cold["written"].get(component, 0) > 0, cold["written"]
    warm = fresh(PIPE, OVERMIND_ZEROCOPY="c")
    assert warm["hits"] >= 1
    assert warm["cached"] == warm["plain"] == cold["plain"]
