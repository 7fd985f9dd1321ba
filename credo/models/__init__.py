"""Policies: tiny models built from a config, local Hugging Face models, checkpoints as HF directories."""
from credo.models.build import (
    build_model,
    load_model,
    load_or_build,
    load_tokenizer,
    num_parameters,
    quiet_transformers,
    save_model,
)
from credo.models.value import ValueModel
from credo.models.tokenizer import build_char_tokenizer, encode_prompt, encode_response

__all__ = ["ValueModel", "build_char_tokenizer", "encode_prompt", "encode_response", "build_model", "load_model", "load_or_build", "load_tokenizer", "num_parameters",
           "quiet_transformers", "save_model"]
