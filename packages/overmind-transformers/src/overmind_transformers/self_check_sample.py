"""The object the transformers adapter sends through the entry codec to prove itself on an untested release
(:mod:`overmind.loading.adapter_check`): a two-layer BERT built from its config and a word-level fast tokenizer
built in memory, the two kinds of object the adapter's hooks and reducers handle. Nothing is read from disk.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def sample() -> dict[str, Any]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    config = BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=8, max_position_embeddings=16)
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "cached": 2, "like": 3, "plain": 4},
                                         unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    return {"model": BertModel(config).eval(), "tokenizer": tokenizer}


def describe(obj: dict[str, Any]) -> Any:
    """The model as the core describes a module; the tokenizer by its class, backend and what it makes of text."""
    from overmind.adapter import SelfCheck

    tokenizer = obj["tokenizer"]
    return (SelfCheck.default_describe(obj["model"]), type(tokenizer).__qualname__,
            tokenizer.backend_tokenizer.to_str(), tokenizer("cached like plain, unknown")["input_ids"],
            tokenizer.pad_token, len(tokenizer))
