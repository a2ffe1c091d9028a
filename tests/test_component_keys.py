"""Components users pass to ``from_pretrained`` (tokenizers, schedulers, configs) are keyed by their full
content: two that a loader could tell apart never share a key, and one and the same component has the same
key in every process (or a second process would never hit)."""
from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from _support import tiny_models
from overmind.testing import run_fresh

HERE = os.path.dirname(__file__)

KEY_SCRIPT = """
import sys, json
sys.path.insert(0, {here!r})
import overmind
overmind.activate()
import torch
from transformers import AutoTokenizer, LlamaConfig
from diffusers import DDIMScheduler
from overmind.adapters import hooks
from overmind.keys import key
from overmind.testing import report

def loader(component, **kw):
    return component

def key_of(component):
    ld = key.describe_loader(loader)
    args = key.bind_arguments(ld, (component,), {{}})
    return key.make_key(ld, args, [], hooks.key_for_value).key

tok = AutoTokenizer.from_pretrained({tokenizer!r})
sched = DDIMScheduler(beta_end=0.02)
config = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
report([key_of(tok), key_of(sched), key_of(config)])
"""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(tiny_models.build_clip_tokenizer(tmp_path_factory.mktemp("tok")))


def _key_of(component):
    from overmind.adapters import hooks
    from overmind.keys import key

    def loader(component, **kw):
        return component

    ld = key.describe_loader(loader)
    args = key.bind_arguments(ld, (component,), {})
    try:
        return key.make_key(ld, args, [], hooks.key_for_value).key
    except key.Unkeyable:
        return None


def test_the_same_components_have_the_same_key_in_every_process(tokenizer_dir):
    script = KEY_SCRIPT.format(here=HERE, tokenizer=tokenizer_dir)
    first, second = run_fresh(script), run_fresh(script)
    assert first == second and all(first), "a component keyed differently per process never hits"


def test_tokenizers_a_loader_tells_apart_have_different_keys(tokenizer_dir):
    import overmind

    overmind.activate()
    from transformers import AutoTokenizer

    base = AutoTokenizer.from_pretrained(tokenizer_dir)
    k = _key_of(base)
    assert k is not None and _key_of(AutoTokenizer.from_pretrained(tokenizer_dir)) == k
    longer = AutoTokenizer.from_pretrained(tokenizer_dir, model_max_length=99)
    added = AutoTokenizer.from_pretrained(tokenizer_dir)
    added.add_tokens(["<new-token>"])
    padded = AutoTokenizer.from_pretrained(tokenizer_dir)
    padded.padding_side = "left"
    keys = [k, _key_of(longer), _key_of(added), _key_of(padded)]
    assert None not in keys and len(set(keys)) == 4
    # the Rust side alone: a changed normalizer shows in the key too
    rust = AutoTokenizer.from_pretrained(tokenizer_dir)
    rust.backend_tokenizer.enable_truncation(5)
    assert _key_of(rust) not in keys


def test_schedulers_differ_by_config_and_by_timestep_state():
    import overmind

    overmind.activate()
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler

    a = DDIMScheduler()
    keys = {_key_of(a), _key_of(DDIMScheduler(beta_end=0.013)), _key_of(DPMSolverMultistepScheduler())}
    stepped = DDIMScheduler()
    stepped.set_timesteps(10)
    keys.add(_key_of(stepped))
    assert None not in keys and len(keys) == 4
    assert _key_of(DDIMScheduler()) == _key_of(a) == _key_of(copy.deepcopy(a))


def test_a_config_passed_as_config_is_keyed_by_every_attribute():
    import overmind

    overmind.activate()
    from transformers import LlamaConfig

    c = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    k = _key_of(c)
    changed = copy.deepcopy(c)
    changed._attn_implementation_internal = "eager"
    other = copy.deepcopy(c)
    other.rope_theta = 1.0
    assert len({k, _key_of(changed), _key_of(other)}) == 3
    assert json.dumps(c.to_dict(), default=str) and torch is not None


LOADERS_SCRIPT = """
import hashlib
import overmind
overmind.activate()
import diffusers, transformers, sentence_transformers  # the imports patch every target
from overmind.keys import key
from overmind.adapters import patching
from overmind.keys.canon import Walk
from overmind.testing import report
out = {}
for t in patching.patched_targets():
    if t.kind == "replace":
        continue
    original = patching.get_original(t.owner, t.name)
    fn = original.__get__(None, t.owner) if t.kind == "classmethod" else getattr(original, "__func__", original)
    try:
        ld = key.describe_loader(fn)
        out[t.describe()] = hashlib.sha256(repr(key.loader_identity(ld, Walk())).encode()).hexdigest()[:16]
    except key.Unkeyable as e:
        out[t.describe()] = "UNKEYABLE: " + str(e)
report(out)
"""


@pytest.mark.long(40)  # seconds on a CI machine: conftest.py runs it early
def test_every_patched_loader_has_a_key_and_the_same_one_in_every_process():
    """A loader the key code cannot describe would run uncached, silently, forever: every patch target of the
    shipped adapters must have a key, and one and the same key in a second process."""
    first, second = run_fresh(LOADERS_SCRIPT), run_fresh(LOADERS_SCRIPT)
    assert len(first) > 20
    unkeyable = {k: v for k, v in first.items() if v.startswith("UNKEYABLE")}
    assert not unkeyable
    assert first == second
