"""A pipeline folder named as ``m``, ``./m``, ``/abs/m``, ``/abs/m/`` (and as ``pathlib.Path``) in a sequence of
fresh processes: the spellings of one type share an entry, and each process sees its own spelling wherever plain
diffusers derives a string from the path: the pipeline's and a model's ``_name_or_path`` (the argument as given, a
``Path`` stays one), and the components it loads from ``os.path.join(path, name)``, transformers' among them
(``<path>/text_encoder``, ``<path>/tokenizer``); see ``_support/path_spellings.py``.
"""
from __future__ import annotations

import os
import pathlib

from _support import path_spellings as ps
from _support.plain_sequences import compare_with_plain

LOADS = ps.PRELUDE + '''
from diffusers import StableDiffusionPipeline, UNet2DConditionModel

pipe, said, through_pipe = load(lambda: StableDiffusionPipeline.from_pretrained(spelled("sd"), safety_checker=None))
unet, said_unet, through_unet = load(lambda: UNet2DConditionModel.from_pretrained(spelled("sd"), subfolder="unet"))
seen = {"pipe": naming(pipe, "sd"), "unet": naming(unet, "sd"), "said": said + said_unet}
done(seen, {"pipe": through_pipe, "unet": through_unet})
'''


def test_each_process_sees_the_path_as_it_spelled_it(fresh, tiny):
    cwd = os.path.dirname(tiny["ckpt"])
    assert os.path.basename(tiny["ckpt"]) == "sd"
    steps = [x for form in ps.FORMS for x in (ps.spelled_as(*form), LOADS)]
    plain, cached = compare_with_plain(fresh, steps, setup=lambda run: {"cwd": cwd})
    # the spellings show where plain derives from the path, so the comparison above tells them apart
    assert plain[1]["seen"]["pipe"]["._internal_dict['_name_or_path']"] == repr("./sd")
    assert plain[3]["seen"]["pipe"][".unet._internal_dict['_name_or_path']"] == repr(os.path.join(cwd, "sd", "unet"))
    assert plain[4]["seen"]["unet"]["._internal_dict['_name_or_path']"] == repr(pathlib.Path("sd"))
    assert len({repr(r["seen"]) for r in plain[:4]}) == 4  # each str spelling shows
    for i in ps.HITS_EXPECTED:  # served from an entry another spelling made
        assert [cached[i]["through"][load]["hits"] for load in ("pipe", "unet")] == [1, 1], i
