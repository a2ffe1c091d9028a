"""Write the benchmark fixture: an SD1.5 checkpoint (fp16 and fp32), two fp16 ControlNets, a ~1B Llama.

No network: the configurations are the published ones (``fixture_configs.py``), the weights are seeded
random numbers, the CLIP vocabulary is synthesised in the real layout (``clip_vocab.py``). Every model is
saved with its library's own ``save_pretrained``, so the folders are what the libraries write.

    python benchmarks/make_fixture.py --scale small            # ~10 MB, seconds
    python benchmarks/make_fixture.py --scale full             # ~9.4 GiB on disk, a few minutes on 2 cores

Layout under ``benchmarks/fixtures/<scale>/``::

    sd15-fp16/         model_index.json, unet/ vae/ text_encoder/ (fp16 safetensors), tokenizer/, scheduler/,
                       feature_extractor/  (the safety checker is listed in model_index.json, not written)
    sd15-fp32/         the same weights in fp32 (the conversion case: loaded with torch_dtype=torch.float16)
    controlnet-depth/  config.json + diffusion_pytorch_model.fp16.safetensors (variant="fp16")
    controlnet-edge/   the same, other weights
    llama-1b/          LlamaForCausalLM, fp16 (1.1B parameters at full scale)

A folder already complete (its ``.complete`` marker exists) is skipped; ``--force`` rewrites it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import clip_vocab  # noqa: E402
import fixture_configs  # noqa: E402

DEFAULT_ROOT = os.path.join(HERE, "fixtures")
MARK = ".complete"


def fixture_dir(scale: str, root: str = DEFAULT_ROOT) -> str:
    """Where the fixture of ``scale`` lives."""
    return os.path.join(root, scale)


def randomize(model, seed: int) -> None:
    """Give ``model`` (materialised, uninitialised) seeded weights a network could hold: norms 1, biases 0,
    other tensors N(0, 0.02). Normal draws are the slow part (~0.3 s per 100M values on 2 cores)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in sorted(model.state_dict(keep_vars=True).items()):
            if not t.is_floating_point():
                continue
            if name.endswith("bias"):
                t.zero_()
            elif t.dim() == 1 and "norm" in name:
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=g)


def materialise(build):
    """Run ``build()`` on the meta device (no init cost), then give it real, uninitialised CPU memory."""
    import torch

    with torch.device("meta"):
        model = build()
    # Non-persistent buffers (CLIP's position_ids, rotary tables) hold garbage afterwards; that is fine
    # because they are not saved: the loader recomputes them.
    return model.to_empty(device="cpu")


def _done(path: str) -> bool:
    return os.path.exists(os.path.join(path, MARK))


def _start(path: str, force: bool) -> bool:
    """Whether ``path`` must be written; clears a partial or forced folder."""
    if _done(path) and not force:
        print(f"  {path}: complete, skipped")
        return False
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return True


def _finish(path: str, t0: float) -> None:
    open(os.path.join(path, MARK), "w").close()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    print(f"  {path}: {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", flush=True)


def _write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_sd(out: str, cfg: dict, force: bool, dtypes: tuple[str, ...] = ("fp32", "fp16")) -> None:
    """Write ``sd15-fp32`` and ``sd15-fp16`` (same weights, two dtypes), or those of ``dtypes``."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    targets = {k: os.path.join(out, f"sd15-{k}") for k in ("fp32", "fp16") if k in dtypes}
    todo = {k: p for k, p in targets.items() if _start(p, force)}
    if not todo:
        return
    t0 = time.perf_counter()
    builders = {
        "unet": lambda: UNet2DConditionModel.from_config(cfg["unet"]),
        "vae": lambda: AutoencoderKL.from_config(cfg["vae"]),
        "text_encoder": lambda: CLIPTextModel(CLIPTextConfig(**cfg["text_encoder"])),
    }
    for seed, (name, build) in enumerate(builders.items(), start=1):
        model = materialise(build)
        randomize(model, seed)
        for kind, path in todo.items():
            if kind == "fp16":
                model = model.to(torch.float16)
            model.save_pretrained(os.path.join(path, name), safe_serialization=True)
        del model
    for path in todo.values():
        clip_vocab.write_tokenizer(os.path.join(path, "tokenizer"), cfg["clip_merges"])
        _write_json(os.path.join(path, "scheduler", "scheduler_config.json"), cfg["scheduler"])
        _write_json(os.path.join(path, "feature_extractor", "preprocessor_config.json"), cfg["feature_extractor"])
        _write_json(os.path.join(path, "model_index.json"), cfg["model_index"])
        _finish(path, t0)


def write_controlnet(path: str, cfg: dict, seed: int, force: bool) -> None:
    """Write one ControlNetModel with ``variant="fp16"`` (``diffusion_pytorch_model.fp16.safetensors``)."""
    import torch
    from diffusers import ControlNetModel

    if not _start(path, force):
        return
    t0 = time.perf_counter()
    model = materialise(lambda: ControlNetModel.from_config(cfg["controlnet"]))
    randomize(model, seed)
    model.to(torch.float16).save_pretrained(path, variant="fp16", safe_serialization=True)
    _finish(path, t0)


def write_llama(path: str, cfg: dict, force: bool) -> None:
    """Write a LlamaForCausalLM in fp16 (the bitsandbytes scenario quantizes it on load)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not _start(path, force):
        return
    t0 = time.perf_counter()
    model = materialise(lambda: LlamaForCausalLM(LlamaConfig(**cfg["llama"])))
    randomize(model, 7)
    model.to(torch.float16).save_pretrained(path, safe_serialization=True)
    _finish(path, t0)


def build(scale: str, root: str = DEFAULT_ROOT, parts=("sd", "controlnet", "llama"), force: bool = False,
          sd_dtypes: tuple[str, ...] = ("fp32", "fp16")) -> str:
    """Write the fixture of ``scale`` under ``root`` (the SD checkpoint in ``sd_dtypes``); returns its folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = fixture_configs.configs(scale)
    out = fixture_dir(scale, root)
    os.makedirs(out, exist_ok=True)
    if "sd" in parts:
        write_sd(out, cfg, force, sd_dtypes)
    if "controlnet" in parts:
        write_controlnet(os.path.join(out, "controlnet-depth"), cfg, 11, force)
        write_controlnet(os.path.join(out, "controlnet-edge"), cfg, 12, force)
    if "llama" in parts:
        write_llama(os.path.join(out, "llama-1b"), cfg, force)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=("small", "full"), default="small")
    ap.add_argument("--root", default=DEFAULT_ROOT, help="folder that holds <scale>/ (default benchmarks/fixtures)")
    ap.add_argument("--parts", default="sd,controlnet,llama", help="comma-separated subset of sd,controlnet,llama")
    ap.add_argument("--sd-dtypes", default="fp32,fp16", help="the SD checkpoint's dtypes: fp32,fp16 or one of them")
    ap.add_argument("--force", action="store_true", help="rewrite folders that are already complete")
    args = ap.parse_args(argv)
    print(f"make_fixture: writing the {args.scale} fixture under {fixture_dir(args.scale, args.root)}", flush=True)
    build(args.scale, args.root, tuple(args.parts.split(",")), args.force, tuple(args.sd_dtypes.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
