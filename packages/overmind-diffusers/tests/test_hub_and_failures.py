"""A pipeline loaded by Hub id from the local cache is keyed by the resolved snapshot; a pipeline that cannot be
pickled warns (adapter, loader, versions) and the plain pipeline is returned. ``active``: tests/_support/adapter_testlib.py."""
from __future__ import annotations

import warnings

from _support import tiny_models as tm
from _support.adapter_testlib import overmind_warnings

LOAD_HUB_ID = '''
from diffusers import DiffusionPipeline

overmind.activate()
pipe, new_entries, _ = counted_load(lambda: DiffusionPipeline.from_pretrained("tiny-org/tiny-sd"))
cached = tm.state_digest(pipe.unet)
overmind.deactivate()
report({"new_entries": new_entries, "cached": cached,
        "plain": tm.state_digest(DiffusionPipeline.from_pretrained("tiny-org/tiny-sd").unet)})
'''


def test_pipeline_by_hub_id_follows_the_snapshot(fresh, tmp_path):
    hub = tmp_path / "hub"
    tm.build_hf_cache(hub, "tiny-org/tiny-sd", tm.build_sd_pipeline(tmp_path / "sd-a", seed=0))
    env = {"HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "hf-home")}
    first = fresh(LOAD_HUB_ID, **env)
    assert first["new_entries"] >= 1 and first["cached"] == first["plain"]
    tm.build_hf_cache(hub, "tiny-org/tiny-sd", tm.build_sd_pipeline(tmp_path / "sd-b", seed=1))  # refs/main moves
    moved = fresh(LOAD_HUB_ID, **env)
    assert moved["new_entries"] >= 1
    assert moved["cached"] == moved["plain"] != first["cached"]


def test_unpicklable_pipeline_warns_and_returns_the_plain_load(active, tmp_path):
    import diffusers
    import torch
    from diffusers import StableDiffusionPipeline

    folder = tm.build_sd_pipeline(tmp_path / "sd")

    class StreamingPipeline(StableDiffusionPipeline):  # a generator attribute: neither pickle nor dill stores it
        def __init__(self, vae, text_encoder, tokenizer, unet, scheduler, safety_checker, feature_extractor,
                     image_encoder=None, requires_safety_checker=True):
            super().__init__(vae, text_encoder, tokenizer, unet, scheduler, safety_checker, feature_extractor,
                             image_encoder, requires_safety_checker)
            self.stream = (i for i in range(3))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = StreamingPipeline.from_pretrained(folder)
    messages = overmind_warnings(caught)
    assert len(messages) == 1, messages
    assert "adapter diffusers (overmind-diffusers 0.1.0, diffusers " + diffusers.__version__ in messages[0]
    assert "StreamingPipeline.from_pretrained" in messages[0] and "returned the plain result" in messages[0]
    assert isinstance(pipe, StreamingPipeline) and next(pipe.stream) == 0
    out = pipe(tm.SD_PROMPT, num_inference_steps=1, output_type="pt", generator=torch.Generator().manual_seed(0))
    assert out.images.shape == (1, 3, tm.SD_SIZE, tm.SD_SIZE)


def test_single_file_given_a_state_dict_runs_uncached_without_warning(active, tmp_path):
    """What a pipeline's from_single_file passes to each component: keyed, it would hash every tensor."""
    from diffusers import AutoencoderKL

    import overmind

    folder = tm.build_sd_pipeline(tmp_path / "sd")
    state_dict = AutoencoderKL.from_pretrained(folder, subfolder="vae").state_dict()
    entries_before = len(overmind.cache_info(processes=False).entries)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vae = AutoencoderKL.from_single_file(state_dict, config=str(folder), subfolder="vae")
    assert overmind_warnings(caught) == []
    assert len(overmind.cache_info(processes=False).entries) == entries_before
    assert tm.state_digest(vae) == tm.state_digest(AutoencoderKL.from_pretrained(folder, subfolder="vae"))
