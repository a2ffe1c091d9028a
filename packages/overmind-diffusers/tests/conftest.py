"""Fixtures for the diffusers adapter's tests: tiny SD + ControlNet folders built once per session, and a runner
for fresh processes that load through a private Overmind server."""
from __future__ import annotations

import itertools
import json
import os
import textwrap

import pytest

TESTS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
# Test-fixture adapters of the core's own suite are installed in the dev venv; they are not part of a user's setup.
OTHER_ADAPTERS_OFF = "fixture,fixture_broken,future"

PRELUDE = '''
import hashlib, json, os, sys, warnings
import torch
import overmind
from overmind.client import get_client
from overmind.shm import mappings
from overmind.testing import overmind_mapped, report
import tiny_models as tm

P = json.loads(os.environ["TINY"])


def server_state():
    entries = get_client().ls()
    return {"entries": len(entries), "hits": sum(e["hits"] for e in entries)}


def counted_load(fn):
    """(object, new entries on the server, new hits) for one load."""
    before = server_state()
    obj = fn()
    after = server_state()
    return obj, after["entries"] - before["entries"], after["hits"] - before["hits"]


def weight_entries(module):
    """The entry ids whose mappings hold module's tensors (None for a tensor outside any entry)."""
    out = set()
    for t in list(module.parameters()) + list(module.buffers()):
        if t.numel():
            s = t.untyped_storage()
            loc = mappings.locate(s.data_ptr(), s.nbytes())
            out.add(loc.entry_id if loc else None)
    return sorted(out, key=str)


def entry_of_loader(suffix):
    return [e["entry_id"] for e in get_client().ls() if e["meta"].get("loader", "").endswith(suffix)]
'''


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Folders of the tiny SD pipeline, two fp16 ControlNets, a saved MultiControlNetModel, a single-file VAE and a
    custom pipeline (see tests/tiny_models.py), built once per session."""
    import tiny_models as tm
    import torch
    from diffusers import ControlNetModel
    from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("tiny-diffusers")
    paths = tm.build_sd_controlnet_set(root)
    multi = root / "multi-controlnet"
    MultiControlNetModel([ControlNetModel.from_pretrained(p, variant="fp16", torch_dtype=torch.float32)
                          for p in (paths.edge, paths.depth)]).save_pretrained(str(multi))
    from diffusers import AutoencoderKL

    vae_file = root / "vae-single-file.safetensors"
    save_file({k: v.contiguous() for k, v in AutoencoderKL.from_pretrained(paths.ckpt, subfolder="vae").state_dict().items()},
              str(vae_file))
    return {"ckpt": str(paths.ckpt), "depth": str(paths.depth), "edge": str(paths.edge), "multi": str(multi),
            "vae_file": str(vae_file), "custom": str(tm.build_custom_pipeline(root / "custom-pipeline"))}


@pytest.fixture
def fresh(overmind_runtime, tiny, tmp_path):
    """``fresh(script, **env)``: run ``script`` after :data:`PRELUDE` in a new interpreter against this test's
    server; returns what it ``report``-ed. Every run gets its own empty ``HF_MODULES_CACHE`` unless given one.
    ``OVERMIND_STRICT=1``: any fallback fails the run."""
    counter = itertools.count()

    def run(script: str, **env: str):
        from overmind.testing import run_fresh

        full_env = {
            "PYTHONPATH": TESTS_DIR, "OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1",
            "OVERMIND_DISABLED_ADAPTERS": OTHER_ADAPTERS_OFF, "TINY": json.dumps(tiny),
            "HF_MODULES_CACHE": str(tmp_path / f"modules-{next(counter)}"), "TOKENIZERS_PARALLELISM": "false",
        }
        full_env.update(env)
        return run_fresh(PRELUDE + textwrap.dedent(script), env=full_env, timeout=600)

    return run
