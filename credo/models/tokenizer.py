"""A character-level tokenizer for the built-in tasks.

Every printable ASCII character (plus newline and tab) is one token; ``<pad>``, ``<bos>``,
``<eos>`` and ``<unk>`` are special. ``add_special_tokens=True`` prepends ``<bos>``. It is a real
:class:`transformers.PreTrainedTokenizerFast`, saved and reloaded with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` like any Hugging Face tokenizer.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = tuple(dict.fromkeys(string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")))


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=4096,
    )


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt token ids, with the tokenizer's own special tokens (``<bos>`` for credo's tokenizer)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def encode_response(tokenizer, text: str) -> list[int]:
    """Response token ids as the policy should produce them: no BOS, terminated by EOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
