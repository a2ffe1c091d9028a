"""The real adapters on a release of their library newer than their ``tested`` range: each proves itself (its
loaders take what it reads, its sample survives the entry codec) and stays on, and the user's loads are served
and equal to plain.

A newer release cannot be installed for a test, so each fresh process is told that the installed transformers,
diffusers and bitsandbytes lie outside the tested ranges (``libraries.untested`` answers so, before
``activate()``); everything after that is the real path: the self-check on the real libraries, the patches, the
server, the hits. ``scripts/test --latest`` runs the suites on the newest releases themselves.
"""
from __future__ import annotations

import os

import pytest

from overmind.testing import run_fresh

pytest.importorskip("overmind_transformers")
pytest.importorskip("overmind_diffusers")

PRETEND_UNTESTED = '''
from overmind._util import distributions
from overmind.adapters import libraries

def untested(dist):
    names = [r.name for r in libraries.tested_requirements(dist)]
    return [(n, distributions.version(n), "<0.1") for n in names
            if n in ("transformers", "diffusers", "bitsandbytes") and distributions.version(n)]

libraries.untested = untested
'''

USER = PRETEND_UNTESTED + '''
import hashlib, os, warnings
import overmind
from overmind.testing import report

overmind.activate()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    from transformers import AutoModel, AutoTokenizer
    from diffusers import UNet2DConditionModel
    model = AutoModel.from_pretrained(os.environ["BERT"])
    tokenizer = AutoTokenizer.from_pretrained(os.environ["BERT"])
    unet = UNet2DConditionModel.from_pretrained(os.environ["SD"], subfolder="unet")
from overmind.adapters import discovery

def digest(module):
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode() + t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]

states = discovery.states()
info = overmind.cache_info() if os.environ.get("OVERMIND_DISABLE") != "1" else None
report({"adapters": {n: [s.status, [lib for lib, _, _ in s.untested],
                         s.self_check.detail if s.self_check else None] for n, s in states.items()
                     if n in ("transformers", "diffusers", "bnb")},
        "model": [type(model).__name__, digest(model)], "unet": [type(unet).__name__, digest(unet)],
        "ids": tokenizer("hello world")["input_ids"],
        "warnings": [f"{type(w.message).__name__}: {w.message}" for w in caught
                     if "overmind" in str(w.message).lower()],
        "hits": sum(e.hits for e in info.entries) if info else None})
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from _support.tiny_models import build_bert, build_sd_pipeline

    root = tmp_path_factory.mktemp("untested")
    return {"BERT": str(build_bert(root / "bert")), "SD": str(build_sd_pipeline(root / "sd"))}


def test_adapters_on_untested_releases_check_themselves_and_serve_loads_equal_to_plain(models, overmind_runtime,
                                                                                        tmp_path):
    env = {**models, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    plain = run_fresh(USER, env={**env, "OVERMIND_DISABLE": "1"})
    first = run_fresh(USER, env=env)
    second = run_fresh(USER, env=env)
    for name in ("transformers", "diffusers"):
        status, untested, detail = first["adapters"][name]
        assert status == "loaded" and untested == [name], first["adapters"]
        assert "came back equal from the entry codec" in detail, detail
        assert second["adapters"][name][2].endswith("(remembered)")
    if "bnb" in first["adapters"] and first["adapters"]["bnb"][1]:
        assert first["adapters"]["bnb"][0] == "loaded", first["adapters"]["bnb"]
    for run in (first, second):
        assert (run["model"], run["unet"], run["ids"]) == (plain["model"], plain["unet"], plain["ids"])
        assert run["warnings"] == []
    assert second["hits"] == 3, "the three loads are served from the cache"
    assert os.listdir(tmp_path / "cache" / "overmind" / "self-checks")


@pytest.mark.parametrize("adapter", ["transformers", "diffusers", "bnb", "sfast"])
def test_each_adapters_self_check_passes_on_the_installed_release(adapter, tmp_path):
    """What activation runs on an untested release, run here on the installed one: in the newest-releases lane
    (scripts/test --latest) this names the release and the part of the check that broke."""
    from overmind.adapters import discovery

    if discovery.states().get(adapter) is None or discovery.states()[adapter].status != "loaded":
        pytest.skip(f"adapter {adapter} is not loaded here ({discovery.states().get(adapter)})")
    out = run_fresh(f'''
        from overmind.loading import adapter_check
        from overmind.testing import report
        outcome = adapter_check.check_installed({adapter!r})
        report([outcome.passed, outcome.detail])
    ''', env={"XDG_CACHE_HOME": str(tmp_path)})
    assert out[0], f"adapter {adapter}: {out[1]}"


def test_a_loader_that_builds_from_another_model_is_left_plain(tmp_path):
    """transformers 5.25's ``MtpModel.from_pretrained(main_model, ...)`` builds a model from a loaded one, not from
    files: it takes no model path, so the adapter leaves it unpatched (one INFO line) on every version."""
    out = run_fresh('''
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
        import overmind
        overmind.activate()
        import transformers
        from overmind.adapters import patching
        from overmind.testing import report
        try:
            from transformers.modeling_layers import MtpModel
        except ImportError:
            report(None)
        else:
            from transformers import PreTrainedModel
            report([patching.is_patched(MtpModel, "from_pretrained"),
                    patching.is_patched(PreTrainedModel, "from_pretrained")])
    ''', env={"XDG_CACHE_HOME": str(tmp_path)})
    if out is None:
        pytest.skip("this transformers has no MtpModel")
    assert out == [False, True]
