"""A word-level tokenizer over a task's symbols, saved beside the model so TransformerBridge can reload it from disk."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = "<|endoftext|>"  # the one special token (bos = eos = pad = unk), id = len(task.vocab)


def build_tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    """WordLevel tokenizer: token i of ``vocab`` gets id i, whitespace-separated; the special token comes last."""
    ids = {tok: i for i, tok in enumerate(vocab)} | {SPECIAL: len(vocab)}
    core = Tokenizer(models.WordLevel(vocab=ids, unk_token=SPECIAL))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL, pad_token=SPECIAL
    )


def save_tokenizer(vocab: list[str], folder: str | Path) -> None:
    """Write the tokenizer files into ``folder`` (next to config.json and the weights)."""
    build_tokenizer(vocab).save_pretrained(str(folder))
