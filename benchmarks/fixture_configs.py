"""The configurations the benchmark fixture is written with: the published ones (full) and a small scale.

Full scale copies, key for key, the ``config.json`` files published with
``runwayml/stable-diffusion-v1-5`` (unet, vae, text_encoder, scheduler, feature_extractor, model_index),
``lllyasviel/sd-controlnet-depth`` / ``lllyasviel/sd-controlnet-canny`` (ControlNetModel) and
``TinyLlama/TinyLlama-1.1B`` (a ~1.1B-parameter Llama). Keys whose value is the library default today
are kept anyway, so the files look like the published ones. The small scale keeps every class and every
block type but shrinks widths, so a whole fixture is a few MB and builds in seconds (tests, development).
"""
from __future__ import annotations

import copy

SD_UNET = {
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}

SD_VAE = {
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 512,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}

# openai/clip-vit-large-patch14's text tower, as shipped in SD1.5's text_encoder/config.json.
SD_TEXT_ENCODER = {
    "architectures": ["CLIPTextModel"],
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "dropout": 0.0,
    "eos_token_id": 2,
    "hidden_act": "quick_gelu",
    "hidden_size": 768,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "model_type": "clip_text_model",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "projection_dim": 768,
    "vocab_size": 49408,
}

SD_SCHEDULER = {
    "_class_name": "PNDMScheduler",
    "_diffusers_version": "0.6.0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
}

SD_FEATURE_EXTRACTOR = {
    "crop_size": 224,
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor",
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "size": 224,
}

# The safety checker is listed, as published, but not written: the blog passes safety_checker=None.
SD_MODEL_INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "_diffusers_version": "0.6.0",
    "feature_extractor": ["transformers", "CLIPImageProcessor"],
    "safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"],
    "scheduler": ["diffusers", "PNDMScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}

CONTROLNET = {
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "class_embed_type": None,
    "conditioning_embedding_out_channels": [16, 32, 96, 256],
    "controlnet_conditioning_channel_order": "rgb",
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "num_class_embeds": None,
    "only_cross_attention": False,
    "projection_class_embeddings_input_dim": None,
    "resnet_time_scale_shift": "default",
    "upcast_attention": False,
    "use_linear_projection": False,
}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}

CLIP_MERGES = 48894  # 256 bytes + 256 bytes with "</w>" + merges + 2 specials = 49408 tokens


def configs(scale: str) -> dict:
    """Every configuration of the fixture at ``scale`` ("full" or "small"), as fresh dicts."""
    c = copy.deepcopy({
        "unet": SD_UNET, "vae": SD_VAE, "text_encoder": SD_TEXT_ENCODER, "scheduler": SD_SCHEDULER,
        "feature_extractor": SD_FEATURE_EXTRACTOR, "model_index": SD_MODEL_INDEX, "controlnet": CONTROLNET,
        "llama": LLAMA, "clip_merges": CLIP_MERGES,
    })
    if scale == "full":
        return c
    if scale != "small":
        raise ValueError(f"scale must be 'full' or 'small', not {scale!r}")
    small_unet = {"block_out_channels": [32, 64], "layers_per_block": 1, "cross_attention_dim": 32,
                  "attention_head_dim": 4, "sample_size": 16,
                  "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                  "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]}
    c["unet"].update(small_unet)
    c["controlnet"].update({k: v for k, v in small_unet.items() if k not in ("sample_size", "up_block_types")},
                           conditioning_embedding_out_channels=[16, 32])
    c["vae"].update(block_out_channels=[32, 64], layers_per_block=1, sample_size=32,
                    down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2)
    c["clip_merges"] = 486  # a 1,000-token vocabulary
    c["text_encoder"].update(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=5,
                             projection_dim=32, vocab_size=1000)
    # bitsandbytes CPU kernels need out_features divisible by 32.
    c["llama"].update(hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256)
    return c
