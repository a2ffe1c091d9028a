"""Helpers of the overmind-diffusers tests (importable by this name: the package's ``tests/``
folder is on pytest's ``pythonpath``, see the root ``pyproject.toml``).

:func:`write_ldm_checkpoint` writes a diffusers Stable Diffusion (1.x architecture) pipeline
folder as one original-format (LDM / CompVis) single-file ``.safetensors`` checkpoint, so tests can
load it with ``StableDiffusionPipeline.from_single_file``.

The layout written here is the public LDM one:

* UNet under ``model.diffusion_model.``: ``input_blocks.N.M`` (``N = 0`` is ``conv_in``; then,
  per down block, ``layers_per_block`` blocks holding a resnet at ``.0`` and, for cross-attention
  blocks, a spatial transformer at ``.1``, then one block holding the downsampler ``.0.op`` except
  after the last down block), ``middle_block.0/1/2`` (resnet, transformer, resnet),
  ``output_blocks.N.M`` (per up block, ``layers_per_block + 1`` blocks: resnet at ``.0``,
  transformer at ``.1`` if any, and the upsampler after them in the last block),
  ``time_embed.0/2`` and ``out.0/2``. Resnets name their layers ``in_layers.0/2``,
  ``out_layers.0/3``, ``emb_layers.1`` and ``skip_connection``; transformer internals keep
  diffusers' names.
* VAE under ``first_stage_model.``: ``encoder.down.I.block.J`` / ``.downsample.conv``,
  ``decoder.up.I.block.J`` / ``.upsample.conv`` with the up blocks numbered in reverse,
  ``mid.block_1/2`` and ``mid.attn_1`` (``norm``, ``q``, ``k``, ``v``, ``proj_out`` as 1x1
  convolutions), ``norm_out``, ``nin_shortcut`` for resnet shortcuts.
* CLIP text encoder under ``cond_stage_model.transformer.`` with transformers' ``CLIPTextModel``
  names (``text_model.embeddings...``).

Only the layouts the tiny pipeline of ``tests/_support/tiny_models.py`` uses are handled; anything
else raises.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
CLIP_PREFIX = "cond_stage_model.transformer."

_UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0",
                "conv2": "out_layers.3", "time_emb_proj": "emb_layers.1",
                "conv_shortcut": "skip_connection"}
_UNET_TOP = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
             "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}
_VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def _resnet(rest: str, table: dict[str, str]) -> str:
    layer, _, param = rest.rpartition(".")
    if layer not in table:
        raise KeyError(f"unknown resnet layer {layer!r}")
    return f"{table[layer]}.{param}"


def unet_key(key: str, config: dict) -> str:
    """The LDM name (without prefix) of a diffusers ``UNet2DConditionModel`` state-dict key."""
    per = config["layers_per_block"]
    layer, _, param = key.rpartition(".")
    if layer in _UNET_TOP:
        return f"{_UNET_TOP[layer]}.{param}"
    if m := re.fullmatch(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
        b, kind, i, rest = int(m[1]), m[2], int(m[3]), m[4]
        n = 1 + b * (per + 1) + i
        if kind == "resnets":
            return f"input_blocks.{n}.0.{_resnet(rest, _UNET_RESNET)}"
        return f"input_blocks.{n}.1.{rest}"
    if m := re.fullmatch(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(weight|bias)", key):
        return f"input_blocks.{1 + int(m[1]) * (per + 1) + per}.0.op.{m[2]}"
    if m := re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", key):
        return f"middle_block.{2 * int(m[1])}.{_resnet(m[2], _UNET_RESNET)}"
    if m := re.fullmatch(r"mid_block\.attentions\.0\.(.+)", key):
        return f"middle_block.1.{m[1]}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
        b, kind, i, rest = int(m[1]), m[2], int(m[3]), m[4]
        n = b * (per + 1) + i  # each up block has layers_per_block + 1 layers
        if kind == "resnets":
            return f"output_blocks.{n}.0.{_resnet(rest, _UNET_RESNET)}"
        return f"output_blocks.{n}.1.{rest}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(weight|bias)", key):
        b = int(m[1])
        has_attention = "CrossAttn" in config["up_block_types"][b]
        return f"output_blocks.{b * (per + 1) + per}.{2 if has_attention else 1}.conv.{m[2]}"
    raise KeyError(f"no LDM name for UNet key {key!r}")


def vae_key(key: str, config: dict) -> str:
    """The LDM name (without prefix) of a diffusers ``AutoencoderKL`` state-dict key."""
    n_up = len(config["up_block_types"])
    if key.startswith(("quant_conv.", "post_quant_conv.")):
        return key
    coder, _, rest = key.partition(".")
    if coder not in ("encoder", "decoder"):
        raise KeyError(f"no LDM name for VAE key {key!r}")
    layer, _, param = rest.rpartition(".")
    if layer in ("conv_in", "conv_out"):
        return key
    if layer == "conv_norm_out":
        return f"{coder}.norm_out.{param}"
    shortcut = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2",
                "conv_shortcut": "nin_shortcut"}
    if m := re.fullmatch(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
        return f"{coder}.down.{m[1]}.block.{m[2]}.{_resnet(m[3], shortcut)}"
    if m := re.fullmatch(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(weight|bias)", rest):
        return f"{coder}.down.{m[1]}.downsample.conv.{m[2]}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
        return f"{coder}.up.{n_up - 1 - int(m[1])}.block.{m[2]}.{_resnet(m[3], shortcut)}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(weight|bias)", rest):
        return f"{coder}.up.{n_up - 1 - int(m[1])}.upsample.conv.{m[2]}"
    if m := re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", rest):
        return f"{coder}.mid.block_{int(m[1]) + 1}.{_resnet(m[2], shortcut)}"
    if m := re.fullmatch(r"mid_block\.attentions\.0\.(.+)\.(weight|bias)", rest):
        if m[1] not in _VAE_ATTN:
            raise KeyError(f"unknown VAE attention layer {m[1]!r}")
        return f"{coder}.mid.attn_1.{_VAE_ATTN[m[1]]}.{m[2]}"
    raise KeyError(f"no LDM name for VAE key {key!r}")


def clip_key(key: str) -> str:
    """The LDM name (without prefix) of a transformers ``CLIPTextModel`` state-dict key."""
    return key if key.startswith("text_model.") else "text_model." + key


def _component_state(folder: Path, name: str) -> tuple[dict, dict]:
    """(state dict, config) of one component folder, read from its safetensors file as stored."""
    from safetensors.torch import load_file

    files = sorted((folder / name).glob("*.safetensors"))
    if len(files) != 1:
        raise FileNotFoundError(f"expected one safetensors file in {folder / name}, found {files}")
    return load_file(str(files[0])), json.loads((folder / name / "config.json").read_text())


def write_ldm_checkpoint(pipeline_folder, path) -> Path:
    """Write ``pipeline_folder``'s (a saved SD1.x ``StableDiffusionPipeline``) unet, vae and
    text_encoder to ``path`` as one LDM-format ``.safetensors`` file; returns ``path``."""
    from safetensors.torch import save_file

    folder, path = Path(pipeline_folder), Path(path)
    out = {}

    def put(name, t):
        if name in out:
            raise KeyError(f"two tensors map to {name!r}")
        out[name] = t.contiguous().clone()

    unet, unet_config = _component_state(folder, "unet")
    for k, t in unet.items():
        put(UNET_PREFIX + unet_key(k, unet_config), t)
    vae, vae_config = _component_state(folder, "vae")
    for k, t in vae.items():
        ldm = vae_key(k, vae_config)
        if ".mid.attn_1." in ldm and ldm.endswith(".weight") and t.ndim == 2:
            t = t[:, :, None, None]  # LDM's VAE attention projections are 1x1 convolutions
        put(VAE_PREFIX + ldm, t)
    clip, _ = _component_state(folder, "text_encoder")
    for k, t in clip.items():
        put(CLIP_PREFIX + clip_key(k), t)
    save_file(out, str(path))
    return path
