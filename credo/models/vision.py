"""Vision-language policies: a tiny LLaVA (CLIP vision tower + Qwen2 text model) and the image plumbing.

``model.arch: llava`` builds :class:`transformers.LlavaForConditionalGeneration` from a tiny ``CLIPVisionConfig``
(``model.vision``) and a tiny ``Qwen2Config`` (the text sizes of ``model``), with credo's character tokenizer plus
one special token ``<image>`` (docs/algorithms/vepo.md#images). A local HF directory of such a model loads
through :func:`credo.models.build.load_model` like the text models.

Layout: an example carries its image as ``Example.meta["image"]``, a uint8 array (H, W, 3). Its prompt holds one
``<image>`` placeholder that :func:`expand_image_prompts` widens to the number of image features the model reads
(``(image_size / patch_size)^2``, +1 with ``feature_select: full``), so every prompt tokenises to
``<bos> + <image> * n + question``. Pixels reach the model as ``pixel_values`` (B, 3, H, W), normalised
``(x - 0.5) / 0.5`` from raw values x in [0, 1] (:func:`normalize_pixels`); image perturbations act on the raw
values before normalisation (:mod:`credo.methods.vepo.image`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import torch

IMAGE_TOKEN = "<image>"
VISION_MODEL_TYPES = ("llava",)


def add_image_token(tokenizer) -> int:
    """Add ``<image>`` as a special token (once) and return its id; it is never the pad token."""
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if image_id == tokenizer.pad_token_id:
        raise ValueError(f"the image token {IMAGE_TOKEN!r} has the pad token's id {image_id}")
    return image_id


def build_llava(cfg, tokenizer, dtype: torch.dtype) -> torch.nn.Module:
    """A freshly initialised tiny LLaVA (``cfg`` is a :class:`credo.config.schema.ModelConfig`); the caller seeds."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    v = cfg.vision
    if v.image_size % v.patch_size:
        raise ValueError(f"model.vision.image_size {v.image_size} must be a multiple of patch_size {v.patch_size}")
    image_id = add_image_token(tokenizer)
    vision = CLIPVisionConfig(hidden_size=v.hidden, intermediate_size=v.intermediate, num_hidden_layers=v.layers,
                              num_attention_heads=v.heads, image_size=v.image_size, patch_size=v.patch_size)
    text = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                         vision_feature_select_strategy=v.feature_select, vision_feature_layer=-1,
                         tie_word_embeddings=True, attn_implementation=cfg.attn_implementation)
    model = LlavaForConditionalGeneration(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def is_vision_model(model: Any) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) in VISION_MODEL_TYPES


def image_token_id(config: Any) -> int:
    """The ``<image>`` id of a LLaVA config (``image_token_id``; ``image_token_index`` in older releases)."""
    value = getattr(config, "image_token_id", None)
    return int(value if value is not None else config.image_token_index)


def image_token_count(config: Any) -> int:
    """Image features per image (the ``<image>`` tokens a prompt must hold): patches, +1 for ``full`` (CLS)."""
    v = config.vision_config
    patches = (v.image_size // v.patch_size) ** 2
    return patches + (1 if config.vision_feature_select_strategy == "full" else 0)


def image_size(config: Any) -> int:
    return int(config.vision_config.image_size)


def expand_image_prompts(data, model):
    """``data`` (a :class:`credo.data.source.TaskData`) with each image example's ``<image>`` placeholder widened
    to the model's image-token count (prepended when the prompt has none). Text-only data is returned as is; image
    examples with a text-only policy, or images of the wrong size, are a ValueError."""
    examples = (*data.train, *data.eval, *(e for st in data.stage_train for e in st))
    if not any("image" in ex.meta for ex in examples):
        return data
    if not is_vision_model(model):
        raise ValueError("the task's examples carry images but the policy is a text-only model; use "
                         "model.arch=llava (or a local LLaVA directory as model.path)")
    n, size = image_token_count(model.config), image_size(model.config)

    def widen(ex):
        if "image" not in ex.meta:
            raise ValueError(f"example {ex.uid or ex.prompt!r} has no image while others do")
        shape = np.shape(ex.meta["image"])
        if tuple(shape) != (size, size, 3):
            raise ValueError(f"example {ex.uid!r}: image of shape {shape}, the vision tower reads ({size}, {size}, 3)")
        text = ex.prompt
        text = text.replace(IMAGE_TOKEN, IMAGE_TOKEN * n, 1) if IMAGE_TOKEN in text else IMAGE_TOKEN * n + text
        return dataclasses.replace(ex, prompt=text)

    return dataclasses.replace(data, train=[widen(e) for e in data.train], eval=[widen(e) for e in data.eval],
                               stage_train=[[widen(e) for e in st] for st in data.stage_train])


def raw_pixels(images: Sequence[Any]) -> torch.Tensor:
    """uint8 images (H, W, 3) -> float raw pixels in [0, 1], (B, 3, H, W)."""
    arr = np.stack([np.asarray(img, dtype=np.uint8) for img in images])  # (B, H, W, 3)
    return torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 255.0


def normalize_pixels(raw: torch.Tensor) -> torch.Tensor:
    """Model input from raw pixels in [0, 1]: (x - 0.5) / 0.5, same shape."""
    return (raw - 0.5) / 0.5


def example_pixels(examples: Sequence[Any]) -> torch.Tensor | None:
    """Normalised ``pixel_values`` (B, 3, H, W) of examples that carry ``meta["image"]``; None when none does, a
    ValueError when only some do."""
    has = [("image" in ex.meta) for ex in examples]
    if not any(has):
        return None
    if not all(has):
        raise ValueError(f"{has.count(False)} of {len(has)} rows have no image while the others do")
    return normalize_pixels(raw_pixels([ex.meta["image"] for ex in examples]))
