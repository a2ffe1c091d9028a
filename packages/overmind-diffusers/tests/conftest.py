"""Fixtures for the diffusers adapter's tests: tiny SD + ControlNet folders built once per session, and a runner
for fresh processes that load through a private Overmind server (``fresh``, ``active``: tests/_support/adapter_testlib.py)."""
from __future__ import annotations

import pytest

from _support.adapter_testlib import PRELUDE, active, fresh_runner  # noqa: F401  (active: a fixture for the tests)

DIFFUSERS_PRELUDE = '''
from overmind.testing import mapped_entry


def weight_entries(module):
    """The entry ids whose mappings hold module's tensors (None for a tensor outside any entry)."""
    out = set()
    for t in list(module.parameters()) + list(module.buffers()):
        if t.numel():
            s = t.untyped_storage()
            out.add(mapped_entry(s.data_ptr(), s.nbytes()))
    return sorted(out, key=str)


def entry_of_loader(suffix):
    return [e.entry_id for e in overmind.cache_info(processes=False).entries if e.loader.endswith(suffix)]
'''


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Folders of the tiny SD pipeline, two fp16 ControlNets, a saved MultiControlNetModel, a single-file VAE and a
    custom pipeline (see tests/_support/tiny_models.py), built once per session."""
    import torch
    from diffusers import ControlNetModel
    from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel
    from safetensors.torch import save_file

    from _support import tiny_models as tm

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
    """``fresh(script, **env)``: run ``script`` after the shared prelude and :data:`DIFFUSERS_PRELUDE` in a new
    interpreter against this test's server; see ``_support.adapter_testlib.fresh_runner``."""
    return fresh_runner(PRELUDE + DIFFUSERS_PRELUDE, tiny, tmp_path)
