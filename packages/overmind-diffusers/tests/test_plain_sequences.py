"""Sequences of fresh processes, plain against cached, where process state decides what a diffusers load returns
(``_support/plain_sequences.py``): each process must see what the plain one sees, and the cache must still serve.

- a subclass of ``UNet2DConditionModel`` and of ``StableDiffusionPipeline`` defined inside a function: the result
  is an instance of that very class;
- a load under ``torch.inference_mode()``: diffusers returns inference tensors there (transformers does not:
  ``packages/overmind-transformers/tests/test_plain_sequences.py``);
- a load inside ``accelerate.init_empty_weights()`` and one outside it.
"""
from __future__ import annotations

from _support.plain_sequences import compare_with_plain

LOCAL_CLASSES = '''
from diffusers import StableDiffusionPipeline, UNet2DConditionModel

def define():
    class CustomUNet(UNet2DConditionModel):
        pass

    class CustomPipeline(StableDiffusionPipeline):
        def hello(self):
            return "custom"
    return CustomUNet, CustomPipeline

CustomUNet, CustomPipeline = define()
unet, said, through_unet = load(lambda: CustomUNet.from_pretrained(P["ckpt"], subfolder="unet"))
pipe, said_pipe, through_pipe = load(lambda: CustomPipeline.from_pretrained(P["ckpt"], safety_checker=None))
unet_again, _, through_unet_again = load(lambda: CustomUNet.from_pretrained(P["ckpt"], subfolder="unet"))
pipe_again, _, through_pipe_again = load(lambda: CustomPipeline.from_pretrained(P["ckpt"], safety_checker=None))
seen = {"unet": [type(unet) is CustomUNet, type(unet_again) is CustomUNet],
        "pipe": [type(pipe) is CustomPipeline, type(pipe_again) is CustomPipeline, pipe_again.hello()],
        "said": said + said_pipe, "digest": tm.state_digest(unet_again)}
done(seen, {"unet": through_unet_again, "pipe": through_pipe_again, "unet_first": through_unet})
'''


def test_local_unet_and_pipeline_subclasses_come_back_as_those_classes(fresh):
    plain, cached = compare_with_plain(fresh, [LOCAL_CLASSES, LOCAL_CLASSES])
    assert plain[0]["seen"]["unet"] == [True, True] and plain[0]["seen"]["pipe"][:2] == [True, True]
    assert cached[1]["through"]["unet_first"]["hits"] == 1  # served from the first call of the next process
    assert cached[1]["through"]["unet"]["hits"] == 1 and cached[1]["through"]["pipe"]["hits"] >= 1


INFERENCE_MODE = '''
from diffusers import UNet2DConditionModel

def load_unet():
    with torch.inference_mode():
        return UNet2DConditionModel.from_pretrained(P["ckpt"], subfolder="unet")

unet, said, through = load(load_unet)
flags = sorted({t.is_inference() for t in unet.parameters()})
done({"inference": flags, "said": said, "digest": tm.state_digest(unet)}, through)
'''


def test_a_load_under_inference_mode_returns_what_plain_diffusers_returns(fresh):
    plain, cached = compare_with_plain(fresh, [INFERENCE_MODE, INFERENCE_MODE])
    assert plain[0]["seen"]["inference"] == [True]
    assert cached[1]["through"]["hits"] == 1


EMPTY_WEIGHTS = '''
from accelerate import init_empty_weights
from diffusers import UNet2DConditionModel

def load_unet():
    if S["inside"]:
        with init_empty_weights():
            return UNet2DConditionModel.from_pretrained(P["ckpt"], subfolder="unet")
    return UNet2DConditionModel.from_pretrained(P["ckpt"], subfolder="unet")

unet, said, through = load(load_unet)
devices = sorted({p.device.type for p in unet.parameters()})
done({"devices": devices, "said": said, "digest": tm.state_digest(unet) if devices == ["cpu"] else None}, through)
'''


def test_init_empty_weights_and_a_plain_load_each_get_their_own_result(fresh):
    def inside(flag):
        return lambda extra: extra.update(inside=flag)

    steps = [inside(True), EMPTY_WEIGHTS, inside(False), EMPTY_WEIGHTS, inside(True), EMPTY_WEIGHTS]
    plain, cached = compare_with_plain(fresh, steps)
    assert [r["seen"]["devices"] for r in plain][1] == ["cpu"]
    assert cached[2]["through"]["hits"] == 1
