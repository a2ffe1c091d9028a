"""The vision libraries of the timm lane, in fresh processes that never seed torch's generator, against plain.

A process that imports ``overmind`` before torch and never seeds starts torch's generator from the OS, so a loader
that builds its network at random starts from a state no other process has. Where the checkpoint overwrites every
drawn value, the result is the same in every such process: the first one publishes it, every later one hits it and
leaves the generator as it is. Where the result keeps drawn values (a head the checkpoint lacks), each process draws
its own, as plain does, and nothing is cached.

One script, run plain, then in two processes with Overmind against one private server, loads:

- timm: ``create_model(..., pretrained=True, pretrained_cfg_overlay=dict(file=...))`` with a checkpoint that covers
  the model (its number of classes in the overlay too: else timm drops the checkpoint's head as another task's);
  and with other classes than the checkpoint's, whose head timm leaves as drawn;
- torchvision: ``resnet18(weights=None, num_classes=4)`` then ``load_state_dict(torch.load(path))``, in a function
  of the script passed to ``overmind.load``;
- open_clip: ``create_model_and_transforms(name, pretrained=FILE)`` through ``overmind.load``, a tiny model
  configuration registered with ``open_clip.add_model_config``; its image and text outputs through the returned
  transforms and the tokenizer.

One script for the three, and two processes with Overmind (a miss, then a hit): a process costs seconds of
imports (the three libraries import torchvision).
"""
from __future__ import annotations

import json

import pytest

from _support import pythonpath_env
from _support.snippets import SAID
from overmind.testing import run_fresh

pytest.importorskip("timm", reason="timm (with a torchvision that imports) is not installed here: the timm lane "
                                   "runs these tests (scripts/test --timm)")
pytest.importorskip("open_clip", reason="open_clip_torch is installed in the timm lane (scripts/requirements-timm.txt)")

CREATE = "timm.models._factory.create_model"
RESNET = "__main__.load_resnet"
CLIP = "open_clip.factory.create_model_and_transforms"

# embed_dim, towers of one block each; the text tower keeps open_clip's vocabulary (its tokenizer's)
TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}

SCRIPT = SAID + """
import hashlib, json, os
import overmind
from overmind.testing import report
overmind.activate()
import numpy as np
import open_clip, timm, torch, torchvision
from PIL import Image

F = json.loads(os.environ["FILES"])
load = (lambda fn, *a, **k: fn(*a, **k)) if os.environ.get("OVERMIND_DISABLE") == "1" else overmind.load


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state(model, skip=()):
    return digest(t for name, t in sorted(model.state_dict().items()) if not name.startswith(skip))


def moving(fn):
    # (fn's result, whether it moved torch's generator)
    before = torch.get_rng_state()
    result = fn()
    return result, not torch.equal(before, torch.get_rng_state())


def load_resnet(path):
    model = torchvision.models.resnet18(weights=None, num_classes=4)
    model.load_state_dict(torch.load(path))
    return model.eval()


seen = {"unseeded": torch.initial_seed() >= 2**32}
model, moved = moving(lambda: timm.create_model("test_vit", pretrained=True, num_classes=5,
                                                pretrained_cfg_overlay=dict(file=F["vit"], num_classes=5)))
seen["timm"] = [state(model), moved]
head = timm.create_model("test_vit", pretrained=True, num_classes=3, pretrained_cfg_overlay=dict(file=F["vit"]))
seen["timm head"] = [state(head, skip=("head.",)), state(head)]

resnet, moved = moving(lambda: load(load_resnet, F["resnet"]))
with torch.no_grad():
    seen["resnet"] = [state(resnet), moved, digest([resnet(torch.linspace(-1, 1, 3 * 32 * 32).reshape(1, 3, 32, 32))])]

open_clip.add_model_config(F["clip config"])
(clip, train, val), moved = moving(lambda: load(open_clip.create_model_and_transforms, "tinyclip",
                                                pretrained=F["clip"]))
image = Image.fromarray((np.arange(40 * 48 * 3) % 251).astype("uint8").reshape(40, 48, 3))
tokens = open_clip.get_tokenizer("tinyclip")(["a photo of a cat", "a dog"])
with torch.no_grad():
    pixels = val(image).unsqueeze(0)
    seen["clip"] = [state(clip), moved, digest([pixels, clip.encode_image(pixels), clip.encode_text(tokens)]),
                    list(train(image).shape), repr(val)]
seen["said"] = said
report(seen)
"""


@pytest.fixture
def files(tmp_path, weights):
    """The checkpoints: timm's test_vit (5 classes, the conftest's), a torchvision resnet18 (4 classes) and a tiny
    open_clip model, each built from a seed, with the open_clip model's configuration."""
    import open_clip
    import torch
    import torchvision

    config = tmp_path / "tinyclip.json"
    config.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        torch.save(torchvision.models.resnet18(weights=None, num_classes=4).state_dict(), tmp_path / "resnet.pt")
        torch.manual_seed(2)
        torch.save(open_clip.create_model("tinyclip").state_dict(), tmp_path / "clip.pt")
    return {"vit": str(weights["safetensors"]), "resnet": str(tmp_path / "resnet.pt"),
            "clip config": str(config), "clip": str(tmp_path / "clip.pt")}


def _said(run: dict, what: str, loader: str) -> int:
    return sum(1 for m in run["said"] if m.startswith(f"{what} {loader} "))


@pytest.mark.long(20)  # seconds on a CI machine: conftest.py runs it early
def test_unseeded_processes_hit_what_the_checkpoint_covers_and_draw_anew_what_it_does_not(overmind_runtime, files):
    env = {"PYTHONPATH": pythonpath_env(), "FILES": json.dumps(files)}
    plain = run_fresh(SCRIPT, env={**env, "OVERMIND_DISABLE": "1"})
    runs = [run_fresh(SCRIPT, env=env) for _ in range(2)]
    assert all(run["unseeded"] for run in [plain, *runs])
    assert [plain["timm"][1], plain["resnet"][1], plain["clip"][1]] == [True, True, True], "plain draws"

    # a checkpoint that covers the model: published by the first process, hit by every later one, as plain
    for name, loader in (("timm", CREATE), ("resnet", RESNET), ("clip", CLIP)):
        for i, run in enumerate(runs):
            assert run[name][0] == plain[name][0], (name, i, "the weights differ from plain's")
            assert run[name][2:] == plain[name][2:], (name, i, "the outputs differ from plain's")
        assert _said(runs[0], "published", loader) == 1, (name, runs[0]["said"])
        assert _said(runs[1], "hit", loader) == 1 and _said(runs[1], "miss", loader) == (name == "timm"), \
            (name, runs[1]["said"])  # (the head's create_model is a miss in every process)
        assert not runs[1][name][1], (name, "a hit moved torch's generator")

    # a head the checkpoint lacks: each process runs timm and draws its own; the rest is the checkpoint's
    heads = [run["timm head"] for run in [plain, *runs]]
    assert len({whole for _, whole in heads}) == 3, "two processes drew the same head"
    assert {rest for rest, _ in heads} == {plain["timm head"][0]}
    for run in runs:
        assert _said(run, "miss", CREATE) == (2 if run is runs[0] else 1), run["said"]
        kept = [m for m in run["said"] if m.startswith(f"not caching {CREATE}: its result keeps values drawn")]
        assert len(kept) == 1 and "head.weight" in kept[0], run["said"]
