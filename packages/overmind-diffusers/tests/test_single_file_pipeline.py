"""The pipeline-level ``StableDiffusionPipeline.from_single_file`` on a real original-format (LDM / CompVis)
checkpoint: the tiny SD pipeline written as one ``.safetensors`` file (``overmind_diffusers_testlib.py``), loaded plain
(checked bitwise against the pipeline it was written from), then through Overmind in one fresh process (publishes)
and a second fresh process (must be served from Overmind's memory, without running the loader again)."""
from __future__ import annotations

import pytest

from overmind_diffusers_testlib import write_ldm_checkpoint

MODULES = ("unet", "vae", "text_encoder")


@pytest.fixture(scope="module")
def ldm_file(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("ldm") / "tiny-sd-ldm.safetensors"
    return str(write_ldm_checkpoint(tiny["ckpt"], path))


def test_plain_from_single_file_equals_the_tiny_pipeline_bitwise(tiny, ldm_file):
    """Checks the diffusers -> LDM writer itself: diffusers' own converter must give back every weight exactly."""
    import torch
    from diffusers import StableDiffusionPipeline
    from safetensors import safe_open

    from _support import tiny_models as tm

    ref = StableDiffusionPipeline.from_pretrained(tiny["ckpt"])
    got = StableDiffusionPipeline.from_single_file(ldm_file, config=tiny["ckpt"], safety_checker=None,
                                                   local_files_only=True)
    for name in MODULES:
        want, have = getattr(ref, name).state_dict(), getattr(got, name).state_dict()
        assert set(have) == set(want), name
        for key, t in want.items():
            assert have[key].dtype == t.dtype and have[key].shape == t.shape, f"{name}.{key}"
            assert torch.equal(have[key], t), f"{name}.{key} differs"
        assert tm.state_digest(getattr(got, name)) == tm.state_digest(getattr(ref, name))
    with safe_open(ldm_file, "pt") as f:
        keys = list(f.keys())
    # Every tensor of the file was written under one of the three LDM prefixes, one per diffusers weight.
    assert len(keys) == sum(len(getattr(ref, name).state_dict()) for name in MODULES)
    assert {k.split(".")[0] for k in keys} == {"model", "first_stage_model", "cond_stage_model"}
    assert type(got.scheduler) is type(ref.scheduler) and got.safety_checker is None


SINGLE_FILE = '''
import diffusers.loaders.single_file as single_file
from diffusers import StableDiffusionPipeline

reads = []
_read = single_file.load_single_file_checkpoint


def counted_read(*args, **kwargs):  # the checkpoint read at the start of the real pipeline loader
    reads.append(args[0] if args else kwargs.get("pretrained_model_link_or_path"))
    return _read(*args, **kwargs)


single_file.load_single_file_checkpoint = counted_read


def load():
    return StableDiffusionPipeline.from_single_file(os.environ["LDM_FILE"], config=P["ckpt"], safety_checker=None,
                                                    local_files_only=True)


def describe(pipe):
    out = {"class": type(pipe).__name__, "scheduler": type(pipe.scheduler).__name__,
           "safety_checker": pipe.safety_checker is None}
    for name in ("unet", "vae", "text_encoder"):
        module = getattr(pipe, name)
        tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.numel()]
        out[name] = {"digest": tm.state_digest(module), "entries": [str(e) for e in weight_entries(module)],
                     "mapped": all(overmind_mapped(t.untyped_storage().data_ptr()) for t in tensors),
                     "tensors": len(tensors)}
    return out


overmind.activate()
pipe, new_entries, hits = counted_load(load)
cached = describe(pipe)
cached_reads = len(reads)
pipeline_entries = entry_of_loader(".StableDiffusionPipeline.from_single_file")
pipeline_hits = {e.entry_id: e.hits for e in overmind.cache_info(processes=False).entries if e.entry_id in pipeline_entries}
pipeline_deps = sorted({d for e in overmind.cache_info(processes=False).entries if e.entry_id in pipeline_entries for d in e.deps})
gen = torch.Generator().manual_seed(11)
cached_image = tm.tensor_digest(pipe(tm.SD_PROMPT, num_inference_steps=2, output_type="pt", generator=gen).images)
overmind.deactivate()
del reads[:]
plain_pipe = load()  # as loaded: cached storages keep the plain alignment (shm/placer.py)
gen = torch.Generator().manual_seed(11)
plain_image = tm.tensor_digest(plain_pipe(tm.SD_PROMPT, num_inference_steps=2, output_type="pt", generator=gen).images)
report({"cached": cached, "plain": describe(plain_pipe), "new_entries": new_entries, "hits": hits,
        "reads": cached_reads, "plain_reads": len(reads), "pipeline_entries": [str(e) for e in pipeline_entries],
        "pipeline_hits": {str(k): v for k, v in pipeline_hits.items()}, "pipeline_deps": pipeline_deps,
        "cached_image": cached_image, "plain_image": plain_image})
'''


@pytest.mark.long(46)  # seconds on a CI machine: conftest.py runs it early
def test_pipeline_from_single_file_served_from_overmind_in_a_second_process(fresh, ldm_file):
    first = fresh(SINGLE_FILE, LDM_FILE=ldm_file)
    assert first["reads"] == 1, "the first process must run the real loader (read the checkpoint) once"
    assert first["new_entries"] >= 1 and len(first["pipeline_entries"]) == 1
    entry = first["pipeline_entries"][0]
    assert first["plain_reads"] == 1  # the counter sees a plain load: zero reads below means the loader did not run
    for name in MODULES:
        assert first["cached"][name]["digest"] == first["plain"][name]["digest"], name
    assert first["cached_image"] == first["plain_image"]

    second = fresh(SINGLE_FILE, LDM_FILE=ldm_file)
    assert second["reads"] == 0, "the second process ran the single-file loader instead of being served"
    assert second["new_entries"] == 0 and second["hits"] >= 1
    assert second["pipeline_entries"] == first["pipeline_entries"]
    assert second["pipeline_hits"][entry] == first["pipeline_hits"][entry] + 1, "no hit on the pipeline's entry"
    assert second["cached"]["class"] == "StableDiffusionPipeline" and second["cached"]["safety_checker"]
    assert second["cached"]["scheduler"] == second["plain"]["scheduler"] == "PNDMScheduler"
    for name in MODULES:
        got, plain = second["cached"][name], second["plain"][name]
        assert got["tensors"] > 0 and got["mapped"], f"{name}: weights not mapped from Overmind memory"
        # In the pipeline's entry, or (weights the converter left as they lie in the checkpoint) in the checkpoint
        # file itself, a file entry the pipeline's entry depends on.
        files = [e for e in second["pipeline_deps"] if e.startswith("file-")]
        assert got["entries"] and set(got["entries"]) <= {entry, *files}, \
            f"{name}: tensors outside the pipeline entry: {got['entries']}"
        assert got["digest"] == plain["digest"] == first["plain"][name]["digest"], f"{name} differs from a plain load"
        assert not plain["mapped"]
    assert second["cached_image"] == second["plain_image"] == first["plain_image"]
