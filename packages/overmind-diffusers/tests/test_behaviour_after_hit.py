"""What a user does with a diffusers model or pipeline after loading it behaves the same in a process that only hit
as in plain: a sequence of two fresh processes (``_support/plain_sequences.py``), the first cached one the miss, the
second served by hits alone, each compared with its plain twin.

One script, run in each process, loads and records:

* the family of the adapter's self-check sample (``overmind_diffusers/self_check_sample.py``): a ``UNet2DModel``
  and a ``DDPMScheduler`` (saved from ``sample()``) and the ``DDPMPipeline`` of the two: forwards (``return_dict``
  both ways), the pipeline's images (2 steps, seeded), ``pickle.dumps`` / ``torch.save`` / ``copy.deepcopy`` (the
  outcome, or the exception's type where plain raises too, and the copy's forward), ``save_pretrained``'s files, one
  step of training (SGD, ``loss.backward``: loss, gradients, updated weights) and a load again that must give the
  weights on disk;
* the tiny SD pipeline (``tiny_models.build_sd_pipeline``), 2 steps, 32x32, a seeded generator each call: images
  plain, with ``clip_skip=1``, with ``cross_attention_kwargs={"scale": 0.5}``, with a step callback
  (``callback_on_step_end`` recording the step indexes, timesteps and latents), and after a scheduler swap
  (``EulerDiscreteScheduler.from_config(pipe.scheduler.config)``); the UNet's and the text encoder's forwards with
  their output flags; copies of the pipeline after a call; its ``save_pretrained``; a training step of its UNet;
* the warnings and the ``diffusers`` / ``transformers`` log records of all of it.
"""
from __future__ import annotations

import pytest

from _support.plain_sequences import compare_with_plain

CORPUS = '''
import copy, inspect, io, logging, pickle, tempfile
from pathlib import Path
import numpy as np
from diffusers import (DDPMPipeline, DDPMScheduler, EulerDiscreteScheduler, StableDiffusionPipeline,
                       UNet2DModel)

from _support.behaviour_checks import copies, kept_logs, outcome, saved_pretrained, train_step

logs = kept_logs("diffusers", "transformers")


def shape(x):
    """What a user can see of an output: classes, keys, and the exact bytes of every tensor or array."""
    if isinstance(x, torch.Tensor):
        return tm.tensor_digest(x)
    if isinstance(x, np.ndarray):
        return ["ndarray", tm.tensor_digest(torch.from_numpy(np.ascontiguousarray(x)))]
    if hasattr(x, "tobytes") and hasattr(x, "mode"):  # a PIL image
        return ["image", x.mode, list(x.size), hashlib.sha256(x.tobytes()).hexdigest()]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):  # a BaseOutput is an OrderedDict of its set fields
        return [type(x).__name__, {k: shape(v) for k, v in x.items()}]
    if isinstance(x, (tuple, list)):
        return [type(x).__name__, [shape(v) for v in x]]
    return type(x).__name__


def gen():
    return torch.Generator().manual_seed(0)


seen, through = {}, {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")

    # UNet2DModel + DDPMScheduler, the family of the adapter's self-check sample
    unet, said, through["unet2d"] = load(lambda: UNet2DModel.from_pretrained(S["ddpm"], subfolder="unet"))
    sched, said_s, through["ddpm scheduler"] = load(lambda: DDPMScheduler.from_pretrained(S["ddpm"], subfolder="scheduler"))
    x = torch.randn(2, 1, 8, 8, generator=gen())
    t = torch.tensor([3, 7])

    def unet_forward(m):
        with torch.no_grad():
            return [shape(m(x, t)), shape(m(x, t, return_dict=False))]

    s = seen["unet2d"] = {"class": type(unet).__qualname__, "said": said + said_s, "weights": tm.state_digest(unet),
                          "training": unet.training, "scheduler": [type(sched).__qualname__, dict(sched.config)]}
    s["copies as loaded"] = copies(unet, unet_forward)
    s["forward"] = unet_forward(unet)
    s["copies"] = copies(unet, unet_forward)
    s["scheduler copies"] = copies(sched, lambda c: [c.set_timesteps(2), c.timesteps.tolist()][1])
    noisy = sched.add_noise(x, torch.randn(x.shape, generator=gen()), t)
    s["step"] = shape(sched.step(unet(x, t).sample.detach(), 7, x, generator=gen()))
    s["noisy"] = shape(noisy)
    s["saved"] = saved_pretrained(unet)
    s["train"] = train_step(unet, lambda m: (m(noisy, t).sample - x).pow(2).mean())
    again, said_again, through["unet2d again"] = load(lambda: UNet2DModel.from_pretrained(S["ddpm"], subfolder="unet"))
    s["again"] = [tm.state_digest(again), said_again]

    ddpm, said, through["ddpm pipeline"] = load(lambda: DDPMPipeline.from_pretrained(S["ddpm"]))
    ddpm.set_progress_bar_config(disable=True)
    s = seen["ddpm pipeline"] = {"said": said, "components": {k: type(v).__qualname__ for k, v in ddpm.components.items()}}
    s["images"] = shape(ddpm(generator=gen(), num_inference_steps=2, output_type="np").images)
    s["tuple"] = shape(ddpm(generator=gen(), num_inference_steps=2, output_type="np", return_dict=False))
    s["copies"] = copies(ddpm, lambda p: shape(p(generator=gen(), num_inference_steps=2, output_type="np").images))

    # the tiny SD pipeline
    pipe, said, through["sd pipeline"] = load(lambda: StableDiffusionPipeline.from_pretrained(P["ckpt"], safety_checker=None))
    s = seen["sd pipeline"] = {"said": said, "components": {k: type(v).__qualname__ for k, v in pipe.components.items()},
                               "unet": tm.state_digest(pipe.unet), "text_encoder": tm.state_digest(pipe.text_encoder)}
    accepts = inspect.signature(type(pipe).__call__).parameters
    call = dict(prompt=tm.SD_PROMPT, num_inference_steps=2, height=32, width=32)
    s["pil"] = shape(pipe(**call, generator=gen()).images)
    s["np"] = shape(pipe(**call, generator=gen(), output_type="np").images)
    # transformers 5's CLIPTextModel has no .text_model, which diffusers 0.42 reads for clip_skip: plain raises
    s["clip_skip"] = outcome(lambda: shape(pipe(**call, generator=gen(), output_type="np", clip_skip=1).images))
    if "cross_attention_kwargs" in accepts:
        s["scale"] = outcome(lambda: shape(pipe(**call, generator=gen(), output_type="np",
                                                cross_attention_kwargs={"scale": 0.5}).images))
    steps = []

    def on_step(p, i, timestep, kwargs):
        steps.append([i, int(timestep), tm.tensor_digest(kwargs["latents"])])
        return kwargs

    s["callback"] = [outcome(lambda: shape(pipe(**call, generator=gen(), output_type="np", callback_on_step_end=on_step,
                                                callback_on_step_end_tensor_inputs=["latents"]).images)), steps]
    s["copies"] = copies(pipe, lambda p: shape(p(**call, generator=gen(), output_type="np").images))
    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    s["euler"] = [type(pipe.scheduler).__qualname__, shape(pipe(**call, generator=gen(), output_type="np").images)]
    s["saved"] = saved_pretrained(pipe)

    ids = pipe.tokenizer([tm.SD_PROMPT], padding="max_length", return_tensors="pt").input_ids
    latents = torch.randn(1, 4, 16, 16, generator=gen())
    with torch.no_grad():
        text = pipe.text_encoder(ids, output_hidden_states=True)
        s["text_encoder forward"] = [shape(text), shape(pipe.text_encoder(ids, output_hidden_states=True, return_dict=False))]
        hidden = text.last_hidden_state
        s["unet forward"] = [shape(pipe.unet(latents, 5, hidden)), shape(pipe.unet(latents, 5, hidden, return_dict=False)),
                     shape(pipe.unet(latents, 5, hidden, cross_attention_kwargs={"scale": 0.5}))]
    s["train"] = train_step(pipe.unet, lambda m: m(latents, 5, hidden).sample.pow(2).mean())
    again, said_again, through["sd pipeline again"] = load(
        lambda: StableDiffusionPipeline.from_pretrained(P["ckpt"], safety_checker=None))
    s["again"] = [tm.state_digest(again.unet), type(again.scheduler).__qualname__, said_again]

seen["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
seen["logs"] = logs
done(seen, through)
'''


@pytest.fixture(scope="module")
def ddpm(tmp_path_factory):
    """The family of the adapter's self-check sample (a one-block UNet2DModel and a DDPMScheduler), saved as a
    DDPMPipeline. The sample's own UNet is made for the codec, not to run: its mid-block attention has 4 // 8 = 0
    heads, so a forward raises ZeroDivisionError; this one has 2 heads of 2 channels."""
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    folder = tmp_path_factory.mktemp("tiny-ddpm") / "ddpm"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(4,),
                           norm_num_groups=2, down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",),
                           attention_head_dim=2)
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10)).save_pretrained(str(folder))
    return str(folder)


@pytest.mark.long(60)  # seconds on a CI machine: conftest.py runs it early
def test_calls_callbacks_scheduler_swap_copies_and_training_after_a_hit_behave_as_plain(fresh, ddpm):
    plain, cached = compare_with_plain(fresh, [CORPUS, CORPUS], setup=lambda run: {"ddpm": ddpm})
    seen = plain[0]["seen"]
    sd = seen["sd pipeline"]
    assert [step[0] for step in sd["callback"][1]] == [0, 1, 2]  # PNDM's 2 steps run 3 timesteps (a PLMS warm-up)
    assert sd["euler"][0] == "EulerDiscreteScheduler" and sd["euler"][1] != sd["np"]  # the swap changed the images
    assert sd["clip_skip"][0] == "raised" or sd["clip_skip"][1] != sd["np"]
    assert sd["train"]["weights"] != sd["unet"] and sd["again"][0] == sd["unet"]
    assert seen["unet2d"]["again"][0] == seen["unet2d"]["weights"] != seen["unet2d"]["train"]["weights"]
    miss, hit = cached[0]["through"], cached[1]["through"]
    assert sum(t["new_entries"] for t in miss.values()) >= 4, miss
    assert all(t["new_entries"] == 0 and t["hits"] >= 1 for t in hit.values()), hit  # the second process only hit
